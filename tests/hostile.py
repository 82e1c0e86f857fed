"""Helpers for the tests of hostile and broken clients: raw connections, sleeping processes,
the daemon's CPU time, and work done as another user in a forked child."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

#: An unprivileged uid that exists on every Linux machine (nobody).
NOBODY = 65534

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")


def raw(runtime_dir: Path, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(runtime_dir / "gpreempt.sock"))
    return sock


def ask(sock: socket.socket, message: dict | bytes, fds: tuple[int, ...] = ()) -> dict:
    """Send one message (with descriptors) and read one reply line."""
    data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
    if fds:
        import array

        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sock.sendmsg([data], rights)
    else:
        sock.sendall(data)
    buffer = b""
    while b"\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed without a reply (got {buffer!r})")
        buffer += chunk
    return json.loads(buffer.split(b"\n", 1)[0])


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def sleepers(count: int, **popen: object) -> Iterator[list[subprocess.Popen]]:
    """``count`` idle processes, killed at the end (also if they were left stopped)."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen(["sleep", "600"], **popen))  # type: ignore[call-overload]
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in procs:
            proc.wait()


def become(uid: int) -> None:
    """In a forked child of root: become ``uid`` (its own group, no other)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def as_user(uid: int, work: Callable[[], str]) -> str:
    """Run ``work`` in a forked child that became ``uid``; its result (or its error)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            become(uid)
            outcome = work()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            outcome = f"error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        os.write(write_end, outcome.encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as f:
        return f.read().decode()
