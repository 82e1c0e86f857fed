"""Mechanism kfd against the kernel's real behaviour (tests/kfd_fake.py cites each rule):
queues carry EC_QUEUE_NEW until a snapshot clears it, a debug session ends at exec, a failed
activation (RUNTIME_ENABLED_BUSY) refuses every suspension, the grace period's values, and
what the daemon does when the tracer cannot hold the task's queues."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kfd_fake import NEW, FakeKfd, Queue
from test_kfd import COUNTER, Counter, session_factory

from gpreempt.errors import MechanismFailed
from gpreempt.mechanisms import kfd, kfd_abi, kfd_session
from gpreempt.mechanisms.base import Target
from gpreempt.tracer import TracedProcess

# --- 1. new queues ------------------------------------------------------------------------------


def test_queues_still_new_are_suspended_once_a_snapshot_clears_the_bit(tmp_path) -> None:
    fake = FakeKfd(queues=(3, 5))  # a task already on the GPU: its queues were never snapshot
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"), serve=False)
    try:
        outcome = traced.suspend_queues()
        assert (outcome.suspended, outcome.queues, outcome.refused) == (2, 2, [])
        assert fake.suspended == {3, 5}
        proc = fake.process(child.process.pid)
        assert not any(q.exception_status & NEW for q in proc.queues.values())
    finally:
        traced.kill()
        traced.wait(10)


def test_a_queue_made_while_the_task_stops_is_suspended_too(tmp_path) -> None:
    fake = FakeKfd(queues=(3,))
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"), serve=False)
    real_suspend = fake._suspend

    def create_then_suspend(proc, arg):  # a thread finishing AMDKFD_IOC_CREATE_QUEUE
        if 9 not in proc.queues:
            proc.queues[9] = kfd_fake_queue(9)
        return real_suspend(proc, arg)

    fake._suspend = create_then_suspend  # type: ignore[method-assign]
    try:
        outcome = traced.suspend_queues()
        assert fake.suspended == {3, 9}
        assert (outcome.suspended, outcome.queues) == (2, 2)
    finally:
        traced.kill()
        traced.wait(10)


def kfd_fake_queue(queue_id: int) -> Queue:
    return Queue(queue_id)


# --- 2. the session and exec --------------------------------------------------------------------

#: gpreempt run's wrapper: waits for the go byte, then execs the command (the same pid).
WRAPPER = "import os, sys\nos.read(int(sys.argv[1]), 1)\nos.execv(sys.executable, sys.argv[2:])\n"


def wrapped_counter(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    go_r, go_w = os.pipe()
    path = tmp_path / "count"
    process = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(go_r), sys.executable, "-c", COUNTER, str(path)],
        pass_fds=(go_r,),
        preexec_fn=os.setpgrp,
    )
    os.close(go_r)
    return process, go_w, path


def test_a_suspension_before_exec_opens_no_session_and_one_after_holds(tmp_path) -> None:
    fake = FakeKfd(queues=(3, 5))
    process, go, count = wrapped_counter(tmp_path)
    traced = TracedProcess(
        process, session_factory(fake, tmp_path / "kfd"), serve=False, awaiting_exec=True
    )
    try:
        # registration may suspend the wrapper before the go byte: SIGSTOP holds it, and a
        # session opened now would end at the exec
        outcome = traced.suspend_queues()
        assert (outcome.suspended, outcome.queues) == (0, 0)
        assert kfd_abi.OP_ENABLE not in fake.attempts
        traced.resume_queues()
        os.write(go, b"g")
        deadline = time.monotonic() + 20
        while not count.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert traced.suspend_queues().suspended == 2  # a session on the command itself
        assert fake.suspended == {3, 5}
    finally:
        os.close(go)
        traced.kill()
        traced.wait(10)


def test_an_exec_ends_the_session_and_the_next_suspension_opens_another(tmp_path) -> None:
    fake = FakeKfd(queues=(3, 5))
    process, go, count = wrapped_counter(tmp_path)
    # traced as an already running command (no exec expected): the session opens at once
    traced = TracedProcess(process, session_factory(fake, tmp_path / "kfd"), serve=False)
    try:
        assert traced.suspend_queues().suspended == 2  # a session on the wrapper
        traced.resume_queues()
        os.write(go, b"g")  # it execs: the kernel ends that session
        deadline = time.monotonic() + 20
        while not count.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)  # the tracer thread takes in the exec stop
        assert traced.suspend_queues().suspended == 2
        assert fake.attempts.count(kfd_abi.OP_ENABLE) == 2
    finally:
        os.close(go)
        traced.kill()
        traced.wait(10)


# --- 3. activation failed ------------------------------------------------------------------------


def test_runtime_enabled_busy_is_a_failure_not_a_wait(tmp_path) -> None:
    fake = FakeKfd(fail_activation=True)
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"), serve=False)
    try:
        with pytest.raises(MechanismFailed, match="RUNTIME_ENABLED_BUSY"):
            traced.suspend_queues()
        assert "runtime-event" not in fake.log  # nothing waited for an answer
        assert "suspend" not in fake.log  # it would answer EPERM
        proc = fake.process(child.process.pid)
        assert not proc.debug_trap_enabled  # the failed session was closed
        assert proc.runtime_state == kfd_abi.RUNTIME_ENABLED  # kfd_dbg_trap_disable resets it
    finally:
        traced.kill()
        traced.wait(10)


# --- 4. the grace period -------------------------------------------------------------------------


def test_grace_period_zero_is_immediate_and_the_default_is_all_ones(tmp_path) -> None:
    fake = FakeKfd()
    assert kfd_abi.GRACE_IMMEDIATE == 0 and kfd_abi.GRACE_DEFAULT == 0xFFFFFFFF
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"), serve=False)
    try:
        traced.suspend_queues()
        assert fake.graces and set(fake.graces) == {kfd_abi.GRACE_PERIOD}
        assert kfd_abi.GRACE_PERIOD == kfd_abi.GRACE_IMMEDIATE  # as ROCdbgapi asks
    finally:
        traced.kill()
        traced.wait(10)


# --- 6. the fake answers as the kernel does ---------------------------------------------------


def test_the_fake_refuses_as_the_kernel_does(tmp_path) -> None:
    fake = FakeKfd(runtime_state=kfd_abi.RUNTIME_DISABLED)
    child = Counter(tmp_path)
    path = tmp_path / "kfd"
    path.touch()
    pid = child.process.pid

    def on_tracer(fn):
        return traced.call(fn)

    traced = TracedProcess(child.process, session_factory(fake, path), serve=False)
    try:
        device = on_tracer(lambda: kfd_session.KfdDevice(str(path), fake.ioctl))
        r, w = os.pipe()
        on_tracer(lambda: device.enable(pid, w))
        with pytest.raises(MechanismFailed) as again:  # a second session
            on_tracer(lambda: device.enable(pid, w))
        assert again.value.errno == errno.EALREADY  # type: ignore[attr-defined]
        with pytest.raises(MechanismFailed) as early:  # its runtime has not started
            on_tracer(lambda: device.suspend(pid, [3]))
        assert early.value.errno == errno.EPERM  # type: ignore[attr-defined]
        on_tracer(lambda: device.release_runtime(pid))
        assert fake.process(pid).runtime_state == kfd_abi.RUNTIME_DISABLED  # no state change
        if os.fork() == 0:  # a child using the descriptor its parent opened
            try:
                device.version()
            except OSError as exc:
                os._exit(0 if exc.errno == errno.EBADF else 1)
            os._exit(2)
        _, status = os.wait()
        assert os.waitstatus_to_exitcode(status) == 0
        os.close(r)
        os.close(w)
    finally:
        traced.kill()
        traced.wait(10)


# --- the daemon: a failure keeps the task stopped, a suspension of no queue degrades --------


def test_a_tracer_that_fails_leaves_the_task_stopped_not_running(tmp_path) -> None:
    fake = FakeKfd(fail_activation=True)
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"))
    mechanism = kfd.KfdMechanism()
    target = Target(pid=child.process.pid)
    try:
        assert mechanism.suspend(target) == "signal"
        assert not child.runs()  # held by SIGSTOP rather than let run
        assert "kfd failed" in (mechanism.take_degradation(target) or "")
        assert mechanism.take_degradation(target) is None  # told once
        mechanism.resume(target)
        assert child.runs()
    finally:
        traced.kill()
        traced.wait(10)


def test_a_suspension_that_holds_no_queue_degrades_to_signal_for_the_task(tmp_path) -> None:
    fake = FakeKfd(queues=(3, 5))
    child = Counter(tmp_path)
    traced = TracedProcess(child.process, session_factory(fake, tmp_path / "kfd"))
    for queue in fake.create_process(child.process.pid).queues.values():
        queue.being_destroyed = True  # the kernel refuses each one (-EBUSY)
    mechanism = kfd.KfdMechanism()
    target = Target(pid=child.process.pid)
    try:
        assert mechanism.suspend(target) == "signal"
        assert not child.runs()
        note = mechanism.take_degradation(target) or ""
        assert "none of the task's 2 GPU queues" in note
        mechanism.resume(target)
        asked = len(fake.attempts)
        assert mechanism.suspend(target) == "signal"  # from now on, signals only
        assert len(fake.attempts) == asked
        assert not child.runs()
        mechanism.resume(target)
    finally:
        traced.kill()
        traced.wait(10)
