"""Hostile and broken clients cannot stop, slow or crash the daemon (the bounds
docs/robustness.md states)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Daemon, gpreempt, module_daemon, process_state, wait_for
from hostile import NOBODY, as_user, ask, cpu_seconds, needs_root, raw, sleepers

from gpreempt.client.connection import DaemonClient
from gpreempt.control import SIZE
from gpreempt.control_block import REQUIRED_SEALS as ControlBlock_SEALS
from gpreempt.control_block import ControlBlock


def alive_and_answering(daemon: Daemon) -> bool:
    return daemon.process.poll() is None and daemon.answers()


def unsealed_memfd(size: int = SIZE) -> int:
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    return fd


REGISTER_ME = {"register": {"priority": "low", "name": "hostile"}}


# 1 -------------------------------------------------------------------------------------
def test_a_control_block_that_can_shrink_is_refused_and_cannot_crash_the_daemon(
    daemon: Daemon, runtime_dir: Path
) -> None:
    memfd, doorbell = unsealed_memfd(), os.eventfd(0, os.EFD_CLOEXEC)
    try:
        with raw(runtime_dir) as sock:
            reply = ask(sock, {"op": "channel", **REGISTER_ME, "nfds": 2}, (memfd, doorbell))
            os.ftruncate(memfd, 0)  # what crashed a daemon that had mapped it: SIGBUS
            os.eventfd_write(doorbell, 1)
            time.sleep(0.3)
            assert reply["ok"] is False and "sealed" in reply["error"]
            assert alive_and_answering(daemon)
    finally:
        os.close(memfd)
        os.close(doorbell)


def test_a_sealed_block_of_the_wrong_size_is_refused(daemon: Daemon, runtime_dir: Path) -> None:
    memfd = unsealed_memfd(8)
    fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, ControlBlock_SEALS)
    doorbell = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        with raw(runtime_dir) as sock:
            reply = ask(sock, {"op": "channel", **REGISTER_ME, "nfds": 2}, (memfd, doorbell))
        assert reply["ok"] is False and "8 bytes" in reply["error"]
        assert alive_and_answering(daemon)
    finally:
        os.close(memfd)
        os.close(doorbell)


def test_the_clients_own_blocks_are_sealed_so_they_cannot_shrink() -> None:
    block = ControlBlock.create()
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(block.memfd, 0)
    finally:
        block.close()


# 2 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["pipe", "socketpair", "semaphore-eventfd"])
def test_a_doorbell_that_never_resets_costs_the_daemon_no_cpu(
    daemon: Daemon, runtime_dir: Path, kind: str
) -> None:
    block = ControlBlock.create()
    if kind == "pipe":
        doorbell, other = os.pipe()
        os.close(other)  # reads as end-of-file, readable forever
    elif kind == "socketpair":
        left, right = socket.socketpair()
        right.close()
        doorbell = left.detach()
    else:
        doorbell = os.eventfd(2**31, os.EFD_CLOEXEC | os.EFD_SEMAPHORE)
    try:
        with raw(runtime_dir) as sock:
            ask(sock, {"op": "channel", **REGISTER_ME, "nfds": 2}, (block.memfd, doorbell))
            before = cpu_seconds(daemon.process.pid)
            time.sleep(1.0)
            used = cpu_seconds(daemon.process.pid) - before
        assert used < 0.3, f"the daemon spent {used:.2f} s of CPU in 1 s"
        assert alive_and_answering(daemon)
    finally:
        block.close()
        os.close(doorbell)


# 3 -------------------------------------------------------------------------------------
def test_a_client_that_never_reads_its_replies_delays_no_one(
    daemon: Daemon, runtime_dir: Path
) -> None:
    """Requests whose error replies are 60 KB each, sent for 1.5 s and never read: other
    clients are still answered at once (a blocking write took 2 s per reply)."""
    stop = threading.Event()
    hog = raw(runtime_dir)
    hog.setblocking(False)

    def flood() -> None:
        line = json.dumps({"op": "x" * 60_000}).encode() + b"\n"
        pending = b""
        while not stop.is_set():
            try:
                pending = pending or line
                pending = pending[hog.send(pending) :]
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                return  # dropped by the daemon: fine

    thread = threading.Thread(target=flood)
    thread.start()
    try:
        worst = 0.0
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            start = time.monotonic()
            with DaemonClient.connect(runtime_dir, timeout=10) as client:
                client.ping()
            worst = max(worst, time.monotonic() - start)
            time.sleep(0.05)
        assert worst < 1.0, f"a ping took {worst:.2f} s while a client did not read"
    finally:
        stop.set()
        thread.join()
        hog.close()
    assert alive_and_answering(daemon)


def test_a_preempted_task_resumes_on_time_while_a_client_does_not_read(
    daemon: Daemon, runtime_dir: Path
) -> None:
    with (
        sleepers(1) as (low,),
        raw(runtime_dir) as hog,
        DaemonClient.connect(runtime_dir) as client,
    ):
        client.register(low.pid, priority="low")
        # 150 requests whose 60 KB replies are never read: more than the socket buffers hold
        flood = json.dumps({"op": "p" * 60_000}).encode() + b"\n"

        def send_all() -> None:
            with contextlib.suppress(OSError):
                hog.sendall(flood * 150)

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        time.sleep(0.3)
        client.hold(low.pid, True)
        assert wait_for(lambda: process_state(low.pid) == "T", 2)
        start = time.monotonic()
        client.hold(low.pid, False)
        assert wait_for(lambda: process_state(low.pid) != "T", 5)
        assert time.monotonic() - start < 1.0


# 4 -------------------------------------------------------------------------------------
def test_status_answers_past_the_message_cap(daemon: Daemon, runtime_dir: Path) -> None:
    """300 tasks make a reply of several times 64 KiB; `status` and `status --json` answer."""
    with sleepers(300) as procs, DaemonClient.connect(runtime_dir) as client:
        for proc in procs:
            client.register(proc.pid, priority="low", name=f"sleeper-{proc.pid}")
        start = time.monotonic()
        reply = client.status()
        took = time.monotonic() - start
        assert len(reply["tasks"]) == 300
        assert len(json.dumps(reply)) > 2 * 64 * 1024
        assert took < 5.0  # generous: CI machines are slow; measured in the load test
        result = gpreempt(runtime_dir, "status")
        assert result.returncode == 0, result.stderr
        assert str(procs[-1].pid) in result.stdout and "Traceback" not in result.stderr


# 5 -------------------------------------------------------------------------------------
def test_running_out_of_descriptors_costs_connections_not_the_daemon(
    runtime_dir: Path,
) -> None:
    """A daemon allowed 96 descriptors, 400 idle connections: it refuses what it cannot
    hold, goes on checking its tasks, and serves again once they close."""
    import resource
    import subprocess
    import sys

    from conftest import gp_env

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))

    process = subprocess.Popen(
        [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime_dir)],
        env=gp_env(runtime_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=low_limit,
    )
    conns: list[socket.socket] = []
    try:
        assert wait_for(lambda: (runtime_dir / "gpreempt.sock").exists(), 10)
        with sleepers(1) as (task,):
            with DaemonClient.connect(runtime_dir) as client:
                client.register(task.pid, priority="low")
                client.hold(task.pid, True)
            assert wait_for(lambda: process_state(task.pid) == "T", 2)
            for _ in range(400):
                with contextlib.suppress(OSError):
                    conns.append(raw(runtime_dir, timeout=1))
            time.sleep(0.5)
            task.kill()  # its exit is noticed (reading /proc) while connections pile up
            task.wait()
            time.sleep(0.6)
            assert process.poll() is None
        for sock in conns:
            sock.close()
        conns.clear()
        assert wait_for(lambda: _pings(runtime_dir), 5)
        with DaemonClient.connect(runtime_dir) as client:
            assert client.status()["tasks"] == []
    finally:
        for sock in conns:
            sock.close()
        process.terminate()
        process.wait(10)


def _pings(runtime_dir: Path) -> bool:
    try:
        with DaemonClient.connect(runtime_dir, timeout=2) as client:
            return bool(client.ping()["ok"])
    except Exception:  # noqa: BLE001 - not yet
        return False


# 12 ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def refusing_daemon() -> Iterator[Daemon]:
    """One daemon for the out-of-range values: each is refused and leaves nothing behind."""
    with module_daemon() as daemon:
        yield daemon


@pytest.mark.parametrize("value", ["Infinity", "NaN", "1e-300", "1e308", "-1", "true", '"5"'])
def test_numeric_fields_out_of_range_get_a_reply(refusing_daemon: Daemon, value: str) -> None:
    runtime_dir = refusing_daemon.runtime_dir
    with sleepers(1) as (proc,), raw(runtime_dir) as sock:
        line = f'{{"op": "register", "pid": {proc.pid}, "timeslice_ms": {value}}}\n'
        reply = ask(sock, line.encode())
        assert reply["ok"] is False
        assert "timeslice" in reply["error"] or "not a number" in reply["error"]
        assert ask(sock, {"op": "ping"})["ok"]  # the same connection goes on


@needs_root
def test_shared_daemon_holds_users_to_their_priority_ceiling(runtime_dir: Path) -> None:
    os.chmod(runtime_dir, 0o755)
    daemon = Daemon(runtime_dir, "--shared", "--allow-priority", f"{NOBODY + 1}=high")
    try:
        with sleepers(3, user=NOBODY) as procs:

            def try_priorities() -> str:
                outcomes = []
                with DaemonClient.connect(runtime_dir) as client:
                    for proc, priority in zip(procs, ("high", "255", "normal"), strict=True):
                        try:
                            client.register(proc.pid, priority=priority, always_active=True)
                            outcomes.append(f"{priority}: ok")
                        except Exception as exc:  # noqa: BLE001
                            outcomes.append(f"{priority}: {type(exc).__name__} {exc}")
                return "\n".join(outcomes)

            outcome = as_user(NOBODY, try_priorities)
        lines = outcome.splitlines()
        assert lines[0].startswith("high: PermissionDenied") and "ceiling" in lines[0]
        assert lines[1].startswith("255: PermissionDenied")
        assert lines[2] == "normal: ok"
    finally:
        daemon.stop()


# 16 ------------------------------------------------------------------------------------
def test_names_are_escaped_and_unique_per_owner(daemon: Daemon, runtime_dir: Path) -> None:
    with sleepers(3) as procs, DaemonClient.connect(runtime_dir) as client:
        task = client.register(procs[0].pid, name="\x1b[2J\x1b[31mred\nforged")["task"]
        assert task["name"].isprintable() and "\\x1b" in task["name"]
        client.register(procs[1].pid, name="trainer")
        with pytest.raises(Exception, match="already have a task named 'trainer'"):
            client.register(procs[2].pid, name="trainer")
        result = gpreempt(runtime_dir, "status")
        assert "\x1b[2J" not in result.stdout and "\x1b[31" not in result.stdout
        events = (runtime_dir / "events.jsonl").read_text().splitlines()
        assert all(json.loads(line) for line in events)  # no line forged by a newline


def test_pid_true_is_not_pid_1(daemon: Daemon, runtime_dir: Path) -> None:
    with raw(runtime_dir) as sock:
        reply = ask(sock, {"op": "register", "pid": True})
    assert reply["ok"] is False and "whole number" in reply["error"]


def test_lookup_is_by_pid_before_name(daemon: Daemon, runtime_dir: Path) -> None:
    with sleepers(2) as (a, b), DaemonClient.connect(runtime_dir) as client:
        client.register(a.pid, name=str(b.pid))  # a name that is the other task's pid
        client.register(b.pid, name="b")
        client.hold(str(b.pid), True)
        assert wait_for(lambda: process_state(b.pid) == "T", 2)
        assert process_state(a.pid) != "T"


@needs_root
def test_another_users_task_name_does_not_shadow_ours(runtime_dir: Path) -> None:
    os.chmod(runtime_dir, 0o755)
    daemon = Daemon(runtime_dir, "--shared")
    try:
        with sleepers(1) as (mine,), sleepers(1, user=NOBODY) as (theirs,):

            def squat() -> str:
                with DaemonClient.connect(runtime_dir) as client:
                    return client.register(theirs.pid, name="trainer")["task"]["name"]

            assert as_user(NOBODY, squat) == "trainer"
            with DaemonClient.connect(runtime_dir) as client:
                client.register(mine.pid, name="trainer")
                client.hold("trainer", True)
            assert wait_for(lambda: process_state(mine.pid) == "T", 2)
            assert process_state(theirs.pid) != "T"
    finally:
        daemon.stop()


def test_detach_resumes_and_forgets_a_task(daemon: Daemon, runtime_dir: Path) -> None:
    with sleepers(1) as (proc,), DaemonClient.connect(runtime_dir) as client:
        client.register(proc.pid, name="job")
        client.hold("job", True)
        assert wait_for(lambda: process_state(proc.pid) == "T", 2)
        result = gpreempt(runtime_dir, "detach", "job")
        assert result.returncode == 0, result.stderr
        assert wait_for(lambda: process_state(proc.pid) != "T", 2)
        assert client.status()["tasks"] == []
