"""Work held at stream barriers is freed when the watched task and the daemon both go away."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from conftest import SRC, wait_for
from test_watch import _RecordingGate, _Scripted

from gpreempt.client import session as session_mod
from gpreempt.control import ActivityView
from gpreempt.control_block import ControlBlock
from gpreempt.protocol import Connection

# A process that owns a control block inside a request: it hands the block over, then waits.
_OWNER = textwrap.dedent(
    """
    import socket, sys, time
    from gpreempt.control_block import ControlBlock
    from gpreempt.protocol import Connection

    block = ControlBlock.create()
    block.set_requests(1)
    Connection(socket.socket(fileno=int(sys.argv[1]))).send({"block": True}, fds=(block.memfd,))
    time.sleep(60)
    """
)


def _owner_inside_a_request() -> tuple[subprocess.Popen, int]:
    """Start the owner; return it and a read-only descriptor of its block (as the daemon
    sends it)."""
    mine, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=env
    )
    theirs.close()
    _message, (fd,) = Connection(mine).receive()
    mine.close()
    read_only = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    os.close(fd)
    return owner, read_only


class _Gone:
    """A daemon client whose daemon is gone for good."""

    def __init__(self, items: list, runtime_dir: Path) -> None:
        self.connection = _Scripted(items)
        self.runtime_dir = runtime_dir

    def close(self) -> None:
        pass


def _session_losing_its_daemon(tmp_path, owner_pid: int, fd: int, barrier_ms: float):
    own = ControlBlock.create()
    reply = {"task_id": 2, "name": "trainer", "priority": -100, "mechanism": "gate"}
    push = ({"push": "watch", "tasks": [1], "pids": [owner_pid], "version": 1}, [fd])
    gate = _RecordingGate(barrier_ms)
    gone = threading.Event()

    class _Then(_Scripted):
        def receive(self):  # noqa: ANN202
            if self.asked == 0:
                self.asked += 1
                return push
            gone.wait()  # until the test has the gate installed: then the daemon goes away
            return None

    client = _Gone([], tmp_path / "nowhere")
    client.connection = _Then([])
    current = session_mod.Session(client, own, reply)  # type: ignore[arg-type]
    current.use_gate(gate)
    assert wait_for(lambda: current._watch_version == 1, 5)
    view = current._watched[0]
    gone.set()
    assert wait_for(lambda: not current.connected, 5)
    return own, view


def test_a_watched_task_that_exits_after_the_daemon_is_marked_idle(tmp_path) -> None:
    owner, fd = _owner_inside_a_request()
    own = None
    try:
        own, view = _session_losing_its_daemon(tmp_path, owner.pid, fd, barrier_ms=0.05)
        time.sleep(0.3)
        assert view.is_active()  # alive and inside its request: left alone
        owner.kill()
        owner.wait(10)
        assert wait_for(lambda: not view.is_active(), 5), "the barriers' words stayed raised"
    finally:
        owner.kill()
        owner.wait(10)
        if own is not None:
            own.close()


def test_without_barriers_nothing_is_written(tmp_path) -> None:
    owner, fd = _owner_inside_a_request()
    probe_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    probe = ActivityView(probe_fd)
    os.close(probe_fd)
    own = None
    try:
        own, _view = _session_losing_its_daemon(tmp_path, owner.pid, fd, barrier_ms=0.0)
        owner.kill()
        owner.wait(10)
        time.sleep(0.5)
        assert probe.is_active()  # no barrier can wait on it: the words are not ours to touch
    finally:
        owner.kill()
        owner.wait(10)
        if own is not None:
            own.close()
