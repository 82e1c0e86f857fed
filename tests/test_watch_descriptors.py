"""Watch descriptors stay read-only across users: a control block is private to the uid that
created it (``gpreempt.control_block.PRIVATE_MODE``), so the read-only views the daemon hands out
cannot be reopened writable through /proc by another user; the daemon refuses a block it
cannot make private; and a session never watches a block whose words it could not clear
(``gpreempt.client.stranded``). Real processes, other users played by setuid children."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from conftest import wait_for
from hostile import NOBODY, as_user, ask, needs_root, raw
from test_watch import _Client, _RecordingGate

from gpreempt.client import session as session_mod
from gpreempt.client import stranded
from gpreempt.control import SIZE, ActivityView
from gpreempt.control_block import REQUIRED_SEALS, ControlBlock
from gpreempt.daemon.server import Daemon as DaemonServer
from gpreempt.protocol import Connection

#: A second unprivileged uid, the "other user" beside NOBODY.
OTHER = NOBODY - 1


def sealed_memfd() -> int:
    """A block as a client that does not restrict it hands it over: mode 0777, sealed."""
    fd = os.memfd_create("gpreempt-control", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, SIZE)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
    return fd


def adopted_block_of(uid: int) -> ControlBlock:
    """A block created by a process of ``uid`` (left 0777) and adopted as the daemon does."""
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            mine.close()
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            memfd = sealed_memfd()
            Connection(theirs).send({"block": True}, fds=(memfd, os.eventfd(0, os.EFD_CLOEXEC)))
        finally:
            os._exit(0)
    theirs.close()
    os.waitpid(pid, 0)
    _message, (memfd, doorbell) = Connection(mine).receive()
    mine.close()
    return ControlBlock.adopt(memfd, doorbell)


def reopen_writable(fd: int) -> Callable[[], str]:
    """Work for :func:`as_user`: reopen ``fd`` read-write through /proc and say how it went."""

    def work() -> str:
        try:
            os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
        except PermissionError:
            return "denied"
        return "reopened"

    return work


@needs_root
def test_a_watch_descriptor_reopens_writable_for_its_owner_only() -> None:
    block = adopted_block_of(NOBODY)
    view = block.read_only_fd()  # what the daemon sends a watching gate
    try:
        assert stat.S_IMODE(os.fstat(view).st_mode) == 0o600
        assert as_user(NOBODY, reopen_writable(view)) == "reopened"  # same user: nothing gained
        assert as_user(OTHER, reopen_writable(view)) == "denied"
        assert as_user(OTHER, lambda: str(ActivityView(view).is_active())) == "False"  # reads
    finally:
        os.close(view)
        block.close()


def test_the_clients_own_blocks_are_private_from_the_start() -> None:
    block = ControlBlock.create()
    try:
        assert stat.S_IMODE(os.fstat(block.memfd).st_mode) == 0o600
    finally:
        block.close()


def serve_as(uid: int, runtime_dir: Path) -> int:
    """Run a daemon as ``uid`` in a forked child, from the modules this process imported
    (the interpreter may sit where that user cannot read it); its pid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 2)
            daemon = DaemonServer(runtime_dir)
            daemon.start()
            daemon.serve_forever()
        finally:
            os._exit(0)
    return pid


def answers(runtime_dir: Path, pid: int) -> bool:
    """Whether the daemon ``pid`` answers a ping (over a raw socket: a client refuses a
    daemon of another user, which is what this one is)."""
    try:
        with raw(runtime_dir, timeout=1) as sock:
            return ask(sock, {"op": "ping"})["pid"] == pid
    except (OSError, ValueError):
        return False


@needs_root
def test_a_daemon_refuses_a_block_it_cannot_make_private() -> None:
    """A daemon of an unprivileged user cannot restrict root's block: it must not take it."""
    runtime_dir = Path(tempfile.mkdtemp(prefix="gpreempt-nobody-"))
    os.chown(runtime_dir, NOBODY, NOBODY)
    pid = serve_as(NOBODY, runtime_dir)
    memfd, doorbell = sealed_memfd(), os.eventfd(0, os.EFD_CLOEXEC)
    try:
        assert wait_for(lambda: answers(runtime_dir, pid), 10), "the daemon did not start"
        register = {"register": {"priority": "low", "name": "root-block"}}
        with raw(runtime_dir) as sock:
            reply = ask(sock, {"op": "channel", **register, "nfds": 2}, (memfd, doorbell))
        assert reply["ok"] is False and "private" in reply["error"], reply
        assert stat.S_IMODE(os.fstat(memfd).st_mode) == 0o777  # untouched
        assert answers(runtime_dir, pid)
    finally:
        os.close(memfd)
        os.close(doorbell)
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        subprocess.run(["rm", "-rf", str(runtime_dir)], check=False)


def _map_as(uid: int, fd: int, pid: int) -> str:
    def work() -> str:
        try:
            block = stranded.WatchedBlock.map(fd, pid)
        except PermissionError:
            return "refused"
        return "watched" if block.pid == pid and block.pidfd is not None else "no owner"

    return as_user(uid, work)


@needs_root
def test_a_session_watches_only_blocks_whose_words_it_could_clear() -> None:
    """Another user's block (a root process inside a user's task) could not be cleared by the
    session if its owner exited while the daemon is gone: barriers waiting on it would hold
    the task's work for good, so it is not watched; its own user's blocks are."""
    others, its_own = adopted_block_of(OTHER), adopted_block_of(NOBODY)
    fds = [others.read_only_fd(), its_own.read_only_fd()]
    try:
        assert _map_as(NOBODY, fds[0], os.getpid()) == "refused"
        assert _map_as(NOBODY, fds[1], os.getpid()) == "watched"

        def session_watching_both() -> str:
            own = ControlBlock.create()
            reply = {"task_id": 2, "name": "trainer", "priority": -100, "mechanism": "gate"}
            current = session_mod.Session(_Client(), own, reply)  # type: ignore[arg-type]
            gate = _RecordingGate(barrier_ms=0.05)
            current.use_gate(gate)
            current._set_watched([os.dup(fd) for fd in fds], 3, [os.getppid()] * 2)
            addresses, version = gate.calls[-1]
            return f"{len(addresses)} watched, version {version}"

        # one watched; not the list the daemon versioned, so the gate waits for the daemon
        assert as_user(NOBODY, session_watching_both) == "1 watched, version 0"
    finally:
        for fd in fds:
            os.close(fd)
        others.close()
        its_own.close()


@needs_root
def test_a_stranded_block_that_cannot_be_cleared_says_so_in_one_line() -> None:
    """Should such a block be watched anyway, its owner's exit is not silent."""
    owner = subprocess.Popen(["sleep", "60"])
    block = ControlBlock.create()  # root's
    view_fd = block.read_only_fd()

    def work() -> str:
        view = ActivityView(view_fd)
        watched = stranded.WatchedBlock(view, os.dup(view_fd), os.pidfd_open(owner.pid), owner.pid)
        sys.stderr = io.StringIO()
        thread = threading.Thread(target=stranded.free_stranded, args=([watched],))
        thread.start()
        os.write(go_write, b"x")  # the owner is killed now
        thread.join(10)
        return sys.stderr.getvalue()

    go_read, go_write = os.pipe()
    killer = threading.Thread(target=lambda: (os.read(go_read, 1), owner.kill()))
    killer.start()
    try:
        block.set_requests(1)  # the owner exits inside a request
        out = as_user(NOBODY, work)
        killer.join(10)
        lines = out.splitlines()
        assert len(lines) == 1 and f"watched process {owner.pid}" in lines[0], out
        assert block.is_active()  # nobody could clear it
    finally:
        with contextlib.suppress(ProcessLookupError):
            owner.kill()
        owner.wait()
        os.close(view_fd)
        os.close(go_read)
        os.close(go_write)
        block.close()
