"""Hostile descriptors and numbers: what a client hands the daemon never crashes it, never
makes it hold descriptors without bound, and always gets a reply (docs/robustness.md)."""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

import pytest
from conftest import Daemon
from hostile import ask, open_fds, raw

from gpreempt.client.connection import DaemonClient
from gpreempt.control import SIZE
from gpreempt.control_block import REQUIRED_SEALS, ControlBlock
from gpreempt.daemon.limits import Limits
from gpreempt.daemon.outbox import MAX_QUEUED_FDS, Outbox
from gpreempt.protocol import MAX_PENDING_FDS

REGISTER_ME = {"register": {"priority": "low", "name": "hostile"}}


def answering(runtime_dir: Path) -> bool:
    with DaemonClient.connect(runtime_dir, timeout=5) as client:
        return bool(client.status()["ok"])


def sealed_memfd(flags: int = 0, extra_seals: int = 0, size: int = SIZE) -> int:
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | flags)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS | extra_seals)
    return fd


def test_a_hugetlb_memfd_is_refused() -> None:
    """Seals do not stop a hole punched in a hugetlb memfd: the daemon's next read of it
    would be a SIGBUS."""
    try:
        memfd = sealed_memfd(os.MFD_HUGETLB, size=2 << 20)
    except OSError as exc:
        pytest.skip(f"no hugetlb memfds here: {exc.strerror}")
    doorbell = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        with pytest.raises(ValueError, match="hugetlb|HUGETLB"):
            ControlBlock.adopt(memfd, doorbell)
    finally:
        os.close(memfd)
        os.close(doorbell)


def test_a_memfd_sealed_against_writing_gets_a_reply(daemon: Daemon, runtime_dir: Path) -> None:
    memfd = sealed_memfd(extra_seals=fcntl.F_SEAL_WRITE)
    doorbell = os.eventfd(0, os.EFD_CLOEXEC)
    try:
        with raw(runtime_dir) as sock:
            reply = ask(sock, {"op": "channel", **REGISTER_ME, "nfds": 2}, (memfd, doorbell))
        assert reply["ok"] is False and "writing" in reply["error"]
        assert answering(runtime_dir)
    finally:
        os.close(memfd)
        os.close(doorbell)


def test_a_5000_digit_integer_gets_a_reply(daemon: Daemon, runtime_dir: Path) -> None:
    with raw(runtime_dir) as sock:
        reply = ask(sock, b'{"op": "status", "n": ' + b"7" * 5000 + b"}\n")
        assert reply["ok"] is False and "malformed" in reply["error"]
        assert ask(sock, {"op": "ping"})["ok"]  # the same connection goes on


def test_descriptors_no_message_claims_are_capped(daemon: Daemon, runtime_dir: Path) -> None:
    """Bytes that never end a message, each with four descriptors, once held 20,000 of the
    daemon's descriptors: its clients' requests then went unserved."""
    before = open_fds(daemon.process.pid)
    null = os.open(os.devnull, os.O_RDONLY)
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 4))]
    sock = raw(runtime_dir)
    try:
        with contextlib.suppress(OSError):
            for _ in range(300):
                sock.sendmsg([b"x"], rights)
        time.sleep(0.3)
        assert open_fds(daemon.process.pid) < before + 2 * MAX_PENDING_FDS
        assert answering(runtime_dir)
    finally:
        sock.close()
        os.close(null)


def test_the_outbox_caps_descriptors_for_a_client_that_never_reads() -> None:
    left, right = socket.socketpair()
    left.setblocking(False)
    outbox = Outbox(left)
    try:
        assert outbox.put(b"x" * (1 << 20))  # fills the socket: the rest waits
        outbox.flush()
        taken = 0
        for _ in range(MAX_QUEUED_FDS + 8):
            if not outbox.put(b"{}\n", [os.dup(0)]):
                break
            taken += 1
        assert taken <= MAX_QUEUED_FDS
        assert outbox.fds <= MAX_QUEUED_FDS
    finally:
        outbox.discard()
        left.close()
        right.close()


def test_root_is_held_to_a_connection_cap_too() -> None:
    """In Kubernetes most pods are uid 0: one root client once held every connection."""
    limits = Limits()
    limits.size_for_fd_limit(20_000)
    allowed = limits.connections_allowed()
    assert allowed <= limits.max_connections // 2
    assert limits.check_connection(0, allowed, allowed) is not None
    assert limits.check_connection(1000, 0, allowed) is None
    assert limits.fds_per_uid <= 10_000
