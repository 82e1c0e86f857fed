"""Bad input and faults: the daemon stays up and says what was wrong."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Daemon, gpreempt, module_daemon, wait_for

from gpreempt.client.connection import DaemonClient
from gpreempt.errors import NoSuchProcess, NoSuchTask, PermissionDenied, ProtocolError
from gpreempt.protocol import MAX_MESSAGE


def raw(runtime_dir: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(str(runtime_dir / "gpreempt.sock"))
    return sock


@pytest.fixture(scope="module")
def refusing_daemon() -> Iterator[Daemon]:
    """One daemon for the bad requests: each is refused and leaves nothing behind."""
    with module_daemon() as daemon:
        yield daemon


def still_serving(runtime_dir: Path) -> bool:
    with DaemonClient.connect(runtime_dir) as client:
        return client.ping()["ok"]


def test_malformed_message_gets_error_reply(daemon: Daemon, runtime_dir: Path) -> None:
    with raw(runtime_dir) as sock:
        sock.sendall(b"this is not json\n")
        reply = json.loads(sock.recv(4096))
    assert reply["ok"] is False and "not JSON" in reply["error"]
    assert still_serving(runtime_dir)


@pytest.mark.parametrize(
    "message, expect",
    [
        ({"op": "explode"}, "unknown op"),
        ([1, 2], "JSON object"),
        ({"op": "register"}, "bad 'register' request"),
        ({"op": "register", "pid": "abc"}, "bad 'register' request"),
        ({"op": "hold", "target": "nobody", "hold": True}, "no task named"),
        ({"op": "channel"}, "two fds"),
    ],
)
def test_bad_requests_are_refused(refusing_daemon: Daemon, message, expect) -> None:
    runtime_dir = refusing_daemon.runtime_dir
    with raw(runtime_dir) as sock:
        sock.sendall(json.dumps(message).encode() + b"\n")
        reply = json.loads(sock.recv(4096))
    assert reply["ok"] is False
    assert expect in reply["error"]
    assert still_serving(runtime_dir)


def test_oversized_message_is_refused_and_connection_closed(
    daemon: Daemon, runtime_dir: Path
) -> None:
    with raw(runtime_dir) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"x" * (MAX_MESSAGE * 2))
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
    assert b"limit" in data
    assert still_serving(runtime_dir)


def test_half_sent_message_then_disconnect(daemon: Daemon, runtime_dir: Path) -> None:
    with raw(runtime_dir) as sock:
        sock.sendall(b'{"op": "status", "trunc')
    assert still_serving(runtime_dir)


def test_client_disconnecting_mid_request_leaves_daemon_serving(
    daemon: Daemon, runtime_dir: Path
) -> None:
    for _ in range(20):
        sock = raw(runtime_dir)
        sock.sendall(b'{"op": "status"}\n')
        sock.close()  # gone before the reply
    assert still_serving(runtime_dir)


def test_unknown_and_dead_pid(daemon: Daemon, runtime_dir: Path) -> None:
    result = gpreempt(runtime_dir, "attach", "--pid", "999999999")
    assert result.returncode == 2 and "no process" in result.stderr
    proc = subprocess.Popen(["true"])
    proc.wait()
    with DaemonClient.connect(runtime_dir) as client, pytest.raises(NoSuchProcess):
        client.register(proc.pid)


def test_other_users_process_is_refused(daemon: Daemon, runtime_dir: Path) -> None:
    if os.getuid() == 0:
        # Root may act on anyone: check the refusal from an unprivileged peer instead.
        pytest.skip("covered by test_unprivileged_client_cannot_touch_root_process")
    result = gpreempt(runtime_dir, "attach", "--pid", "1")
    assert result.returncode == 1
    assert "uid" in result.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to start a client as another user")
def test_unprivileged_client_cannot_touch_root_process(runtime_dir: Path) -> None:
    os.chmod(runtime_dir, 0o755)
    daemon = Daemon(runtime_dir, "--shared")
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child becomes an unprivileged user and asks for pid 1
            os.close(read_end)
            outcome = b"accepted"
            try:
                os.setgid(65534)
                os.setuid(65534)
                with DaemonClient.connect(runtime_dir) as client:
                    client.register(1)
            except PermissionDenied as exc:
                outcome = b"refused: " + str(exc).encode()
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                outcome = repr(exc).encode()
            os.write(write_end, outcome)
            os._exit(0)
        os.close(write_end)
        os.waitpid(pid, 0)
        with os.fdopen(read_end, "rb") as f:
            outcome = f.read().decode()
        assert outcome.startswith("refused"), outcome
        assert "uid 0" in outcome
    finally:
        daemon.stop()


def test_socket_and_directory_are_private(daemon: Daemon, runtime_dir: Path) -> None:
    assert (runtime_dir.stat().st_mode & 0o777) == 0o700
    assert ((runtime_dir / "gpreempt.sock").stat().st_mode & 0o777) == 0o600


def test_second_daemon_refuses(daemon: Daemon, runtime_dir: Path) -> None:
    result = gpreempt(runtime_dir, "serve", "--runtime-dir", str(runtime_dir), timeout=15)
    assert result.returncode == 1
    assert "already serves" in result.stderr
    assert still_serving(runtime_dir)


def test_unwritable_runtime_dir(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("not a directory")
    result = gpreempt(tmp_path, "serve", "--runtime-dir", str(target / "sub"))
    assert result.returncode == 2
    assert "runtime directory" in result.stderr


def test_lock_without_driver_is_a_clear_error(daemon: Daemon, runtime_dir: Path) -> None:
    from gpreempt.mechanisms.cuda_driver import try_driver

    if try_driver() is not None:
        pytest.skip("this machine has the driver checkpoint API")
    result = gpreempt(runtime_dir, "run", "--mechanism", "lock", "--", "true")
    assert result.returncode == 1
    assert "lock" in result.stderr and "not available" in result.stderr


def test_no_daemon_is_a_clear_error(runtime_dir: Path) -> None:
    result = gpreempt(runtime_dir, "status")
    assert result.returncode == 1
    assert "no gpreempt daemon" in result.stderr


def test_run_starts_a_daemon_when_none_answers(runtime_dir: Path) -> None:
    result = gpreempt(runtime_dir, "run", "--", "true")
    assert result.returncode == 0
    assert "started a daemon" in result.stderr
    pid = int((runtime_dir / "daemon.lock").read_text())
    os.kill(pid, 15)
    assert wait_for(lambda: not (runtime_dir / "gpreempt.sock").exists(), 5)


def test_protocol_error_types_survive_the_wire(daemon: Daemon, runtime_dir: Path) -> None:
    with DaemonClient.connect(runtime_dir) as client, pytest.raises(ProtocolError):
        client.request("nonsense")
    with DaemonClient.connect(runtime_dir) as client, pytest.raises(NoSuchTask):
        client.hold("nobody", True)
