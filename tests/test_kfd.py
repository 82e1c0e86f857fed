"""Mechanism kfd on a CPU: a fake KFD that follows the kernel's rules (struct sizes, ioctl
numbers, op codes, the ptrace-parent rule), the tracer that `gpreempt run --mechanism kfd`
puts on its command, and the command's signals and exit status under that tracer."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import gpreempt, wait_for
from kfd_fake import FakeKfd

from gpreempt.errors import MechanismFailed, MechanismUnavailable
from gpreempt.mechanisms import kfd, kfd_abi, kfd_session
from gpreempt.mechanisms.base import Target
from gpreempt.tracer import TracedProcess


@pytest.fixture
def fake(tmp_path) -> FakeKfd:
    return FakeKfd()


def session_factory(fake: FakeKfd, path: Path):
    path.touch()
    return lambda pid: kfd_session.KfdSession(
        pid, lambda: kfd_session.KfdDevice(str(path), fake.ioctl)
    )


COUNTER = (
    "import sys, time\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    "    open(sys.argv[1] + '.tmp', 'w').write(str(n))\n"
    "    __import__('os').replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "    time.sleep(0.005)\n"
)


class Counter:
    """A CPU child that counts, so that we can see whether it runs."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "count"
        # its own group in this session, never orphaned, so that SIGTSTP stops it whatever group
        # pytest runs in (an orphaned group discards terminal stop signals)
        self.process = subprocess.Popen(
            [sys.executable, "-c", COUNTER, str(self.path)], preexec_fn=os.setpgrp
        )
        deadline = time.monotonic() + 20
        while not self.path.exists():
            assert time.monotonic() < deadline, "the counter did not start"
            time.sleep(0.01)

    def value(self) -> int:
        return int(self.path.read_text() or 0)

    def runs(self, seconds: float = 0.4) -> bool:
        """Whether it counts on within ``seconds``: True as soon as it does, False once they
        passed without a step."""
        before = self.value()
        return wait_for(lambda: self.value() != before, seconds, interval=0.005)


# --- the ABI -------------------------------------------------------------------------------------


def test_abi_matches_kfd_ioctl_h() -> None:
    assert ctypes.sizeof(kfd_abi.DbgTrapArgs) == 32  # u32 pid, u32 op, 24-byte union
    assert ctypes.sizeof(kfd_abi.QueueSnapshotEntry) == 64
    assert ctypes.sizeof(kfd_abi.RuntimeInfo) == 16
    for member in (kfd_abi.EnableArgs, kfd_abi.SuspendQueuesArgs, kfd_abi.QueueSnapshotArgs):
        assert ctypes.sizeof(member) == 24
    assert ctypes.sizeof(kfd_abi.ResumeQueuesArgs) == 16
    assert kfd_abi.DbgTrapArgs.u.offset == 8
    assert kfd_abi.QueueSnapshotEntry.queue_id.offset == 40
    assert kfd_abi.AMDKFD_IOC_DBG_TRAP == 0xC0204B26
    assert kfd_abi.AMDKFD_IOC_GET_VERSION == 0x80084B01
    assert (kfd_abi.OP_ENABLE, kfd_abi.OP_DISABLE, kfd_abi.OP_SEND_RUNTIME_EVENT) == (0, 1, 2)
    assert (kfd_abi.OP_SUSPEND_QUEUES, kfd_abi.OP_RESUME_QUEUES) == (6, 7)
    assert (kfd_abi.OP_QUERY_DEBUG_EVENT, kfd_abi.OP_GET_QUEUE_SNAPSHOT) == (11, 13)
    assert kfd_abi.ec_mask(kfd_abi.EC_PROCESS_RUNTIME) == 1 << 47
    assert (kfd_abi.QUEUE_ERROR_MASK, kfd_abi.QUEUE_INVALID_MASK) == (1 << 30, 1 << 31)


def test_an_older_kfd_is_refused_with_the_version_it_needs(tmp_path) -> None:
    path = tmp_path / "kfd"
    path.touch()
    device = kfd_session.KfdDevice(str(path), FakeKfd(version=(1, 12)).ioctl)
    with pytest.raises(MechanismUnavailable, match=r"1\.12.*needs 1\.13"):
        device.check_version()


def test_no_kfd_device_is_one_clear_line(tmp_path) -> None:
    with pytest.raises(MechanismUnavailable, match="does not exist: no AMD GPU driver"):
        kfd_session.check_available(str(tmp_path / "absent"))


def test_gpreempt_run_refuses_kfd_without_a_driver(tmp_path) -> None:
    if Path(kfd_abi.KFD_DEVICE).exists():
        pytest.skip("this machine has a KFD device")
    result = gpreempt(tmp_path, "run", "--mechanism", "kfd", "--", "true")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "mechanism 'kfd' is not available here" in lines[0]
    assert "Traceback" not in result.stderr


# --- the tracer and the KFD session -------------------------------------------------------------


def test_queues_are_suspended_by_the_tracer_thread_and_resumed(tmp_path, fake) -> None:
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"), serve=False)
    try:
        assert traced.suspend_queues().suspended == 2
        assert fake.suspended == {3, 5}
        assert fake.log[:3] == ["enable", "query", "snapshot"]
        assert traced.resume_queues() == 2
        assert fake.suspended == set()
        assert traced.suspend_queues().suspended == 2  # the session stays open in between
        assert fake.log.count("enable") == 1
    finally:
        traced.kill()
    assert traced.wait(10) == -signal.SIGKILL
    # the command exited while suspended: the tracer closed its session (resume, disable); the
    # kernel answers ESRCH for a process that is gone, having released its queues itself
    traced._thread.join(10)
    assert fake.attempts[-2:] == [kfd_abi.OP_RESUME_QUEUES, kfd_abi.OP_DISABLE]


def test_only_the_ptrace_parent_thread_may_suspend(tmp_path, fake) -> None:
    child = Counter(tmp_path)
    factory = session_factory(fake, tmp_path / "kfd")
    traced = TracedProcess(child.process, factory, serve=False)
    try:
        fake.create_process(child.process.pid)  # it uses the GPU: it has a KFD context
        session = factory(child.process.pid)  # used from this thread, which traces nothing
        with pytest.raises(MechanismFailed, match="not its ptrace parent"):
            session.suspend()
        assert fake.suspended == set()
    finally:
        traced.kill()
        traced.wait(10)


def test_a_runtime_waiting_for_the_debugger_is_released(tmp_path) -> None:
    # the task has not started its ROCm runtime when the session opens; when it does, the
    # kernel blocks it in AMDKFD_IOC_RUNTIME_ENABLE until the debugger answers
    fake = FakeKfd(runtime_state=kfd_abi.RUNTIME_DISABLED, queues=())
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"), serve=False)
    try:
        outcome = traced.suspend_queues()  # nothing to suspend yet: SIGSTOP holds it
        assert (outcome.suspended, outcome.queues) == (0, 0)
        assert "runtime-event" not in fake.log  # nothing waits: nothing to answer
        traced.resume_queues()
        fake.runtime_enable(child.process.pid)  # the runtime enables itself under the session
        assert fake.process(child.process.pid).runtime_waiting
        deadline = time.monotonic() + 5
        while fake.process(child.process.pid).runtime_waiting:
            assert time.monotonic() < deadline, "the tracer did not answer the runtime"
            time.sleep(0.02)
        assert "runtime-event" in fake.log
        assert fake.process(child.process.pid).runtime_state == kfd_abi.RUNTIME_ENABLED
    finally:
        traced.kill()
        traced.wait(10)


def test_the_daemon_suspends_through_the_tracer_socket(tmp_path, fake) -> None:
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"))
    mechanism = kfd.KfdMechanism()
    target = Target(pid=child.process.pid)
    try:
        mechanism.check(target)
        assert mechanism.suspend(target) == "kfd"
        assert fake.suspended == {3, 5}
        assert not child.runs()  # its CPU side is stopped too: no new queues meanwhile
        mechanism.resume(target)
        assert fake.suspended == set()
        assert child.runs()
    finally:
        traced.kill()
        traced.wait(10)
    with pytest.raises(MechanismUnavailable, match="has no KFD tracer"):
        kfd.request(child.process.pid, "ping")


def test_a_socket_not_held_by_the_tracer_is_refused(tmp_path) -> None:
    child = Counter(tmp_path)  # not traced by anyone
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        squatter.bind(kfd.control_address(child.process.pid))
        squatter.listen(1)
        with pytest.raises(MechanismFailed, match="does not trace it"):
            kfd.request(child.process.pid, "suspend", timeout=5)
    finally:
        squatter.close()
        child.process.kill()
        child.process.wait()


# --- the command's signals and exit status are as without tracing -------------------------------


class NoKfd:
    def __init__(self, pid: int) -> None:
        self.events_fd = -1
        self.awaiting_exec = False

    def on_exec(self) -> None:
        pass

    def close(self) -> None:
        pass


def trace(code: str, *args: str) -> TracedProcess:
    return TracedProcess(
        subprocess.Popen([sys.executable, "-c", code, *args]),
        NoKfd,
        serve=False,  # type: ignore[arg-type]
    )


def test_exit_code_is_kept() -> None:
    assert trace("import sys; sys.exit(3)").wait(20) == 3


def test_killed_by_a_signal_is_reported_as_such() -> None:
    traced = trace("import time; time.sleep(60)")
    time.sleep(0.3)
    traced.terminate()
    assert traced.wait(20) == -signal.SIGTERM
    traced = trace("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert traced.wait(20) == -signal.SIGKILL


def test_a_signal_reaches_the_command_handler(tmp_path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "open(sys.argv[1], 'w').close()\n"
        "while True: time.sleep(0.01)\n"
    )
    traced = trace(code, str(ready))
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    traced.terminate()
    assert traced.wait(20) == 7


@pytest.mark.parametrize("stop", [signal.SIGSTOP, signal.SIGTSTP])
def test_stop_signals_stop_until_sigcont(tmp_path, stop) -> None:
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, NoKfd, serve=False)  # type: ignore[arg-type]
    try:
        assert child.runs()
        os.kill(child.process.pid, stop)
        time.sleep(0.2)
        assert not child.runs()
        assert traced.poll() is None
        os.kill(child.process.pid, signal.SIGCONT)
        assert child.runs()
    finally:
        traced.kill()
    assert traced.wait(20) == -signal.SIGKILL
