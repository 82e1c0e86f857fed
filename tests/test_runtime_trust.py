"""Paths another user could have created are never trusted, and losing only the socket file
does not stop the daemon (docs/robustness.md)."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from pathlib import Path

import pytest
from conftest import Daemon, gpreempt, wait_for
from hostile import NOBODY, needs_root

from gpreempt.client.connection import DaemonClient
from gpreempt.errors import PermissionDenied


def fake_daemon(directory: Path, uid: int | None = None) -> int:
    """A process listening at ``directory``'s socket, as ``uid`` (the credentials a client
    sees are those of the process that called listen()); its pid."""
    path = directory / "gpreempt.sock"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            os.chmod(path, 0o777)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            listener.listen(8)
            os.write(ready_w, b"x")
            while True:
                conn, _ = listener.accept()
                conn.sendall(b'{"ok": true, "pid": 1, "policy": "fake"}\n')
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    os.close(ready_r)
    os.close(ready_w)
    return pid


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@needs_root
def test_a_runtime_directory_of_another_user_is_refused() -> None:
    """The attacker pre-creates /tmp/gpreempt-<victim uid> with a daemon of its own."""
    directory = Path(tempfile.mkdtemp(prefix="gp-"))
    os.chown(directory, NOBODY, NOBODY)
    pid = fake_daemon(directory)
    try:
        with pytest.raises(PermissionDenied, match=f"uid {NOBODY}"):
            DaemonClient.connect(directory, timeout=2).close()
        result = gpreempt(directory, "status")
        assert result.returncode != 0 and "neither you nor root" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        stop(pid)
        os.unlink(directory / "gpreempt.sock")
        os.rmdir(directory)


def test_a_runtime_directory_others_can_write_is_refused() -> None:
    directory = Path(tempfile.mkdtemp(prefix="gp-"))
    os.chmod(directory, 0o777)
    pid = fake_daemon(directory)
    try:
        with pytest.raises(PermissionDenied, match="writable by other users"):
            DaemonClient.connect(directory, timeout=2).close()
    finally:
        stop(pid)
        os.unlink(directory / "gpreempt.sock")
        os.rmdir(directory)


@needs_root
def test_a_daemon_of_another_user_is_refused() -> None:
    directory = Path(tempfile.mkdtemp(prefix="gp-"))
    pid = fake_daemon(directory, uid=NOBODY)
    try:
        with pytest.raises(PermissionDenied, match=f"runs as uid {NOBODY}"):
            DaemonClient.connect(directory, timeout=2).close()
    finally:
        stop(pid)
        os.unlink(directory / "gpreempt.sock")
        os.rmdir(directory)


def test_deleting_only_the_socket_does_not_stop_the_daemon(
    daemon: Daemon, runtime_dir: Path
) -> None:
    """It used to conflict with its own lock, resume everything and exit 0."""
    (runtime_dir / "gpreempt.sock").unlink()
    time.sleep(0.5)
    assert daemon.process.poll() is None
    assert wait_for(daemon.answers, 5), "the daemon did not bind its socket again"
