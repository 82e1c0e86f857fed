"""The wire format and the connection: limits, refusals, file descriptors passed with messages."""

from __future__ import annotations

import array
import os
import socket
import time

import pytest

from gpreempt.control_block import ControlBlock
from gpreempt.errors import NoSuchTask, ProtocolError
from gpreempt.protocol import MAX_MESSAGE, Connection, decode, encode, raise_for_reply


def test_wire_format_round_trip_and_limits() -> None:
    assert decode(encode({"op": "ping"}).strip()) == {"op": "ping"}
    with pytest.raises(ProtocolError):
        encode({"blob": "x" * MAX_MESSAGE})
    with pytest.raises(ProtocolError):
        decode(b"[1]")
    with pytest.raises(ProtocolError):
        decode(b"\xff\xfe")


def test_refusals_come_back_as_their_class() -> None:
    with pytest.raises(NoSuchTask, match="nobody"):
        raise_for_reply({"ok": False, "kind": "NoSuchTask", "error": "nobody"})
    assert raise_for_reply({"ok": True, "x": 1})["x"] == 1


def test_connection_passes_fds_with_a_message() -> None:
    left, right = socket.socketpair()
    a, b = Connection(left), Connection(right)
    block = ControlBlock.create()
    try:
        a.send({"op": "channel"}, fds=(block.memfd, block.doorbell))
        message, fds = b.receive()
        assert message == {"op": "channel"} and len(fds) == 2
        remote = ControlBlock(fds[0], fds[1])
        remote.set_gate(True)
        assert block.gate_closed  # the same memory on both ends
        block.set_requests(2)
        assert remote.is_active() and remote.stats().requests == 2
        remote.drain_doorbell()
        remote.close()
    finally:
        block.close()
        a.close()
        b.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_fds_go_to_the_message_they_came_with_when_one_read_returns_two() -> None:
    """A reply and a push with fds sent back to back arrive in one read: the fds belong to
    the push, not to the reply (which the client would close as unexpected)."""
    left, right = socket.socketpair()
    a, b = Connection(left), Connection(right)
    block = ControlBlock.create()
    try:
        a.send({"ok": True})
        a.send({"push": "watch", "tasks": [1]}, fds=(block.read_only_fd(),))
        time.sleep(0.05)  # both are in the socket before the first read
        reply, reply_fds = b.receive()
        push, push_fds = b.receive()
        assert (reply, reply_fds) == ({"ok": True}, [])
        assert push == {"push": "watch", "tasks": [1]} and len(push_fds) == 1
        os.close(push_fds[0])
    finally:
        block.close()
        a.close()
        b.close()


def test_fds_no_message_declares_are_closed_and_a_false_count_is_refused() -> None:
    left, right = socket.socketpair()
    b = Connection(right)
    spare = os.open("/dev/null", os.O_RDONLY)
    try:
        before = _open_fds()
        left.sendmsg(
            [b'{"op":"ping"}\n'],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [spare]))],
        )
        assert b.receive() == ({"op": "ping"}, [])
        assert _open_fds() == before  # the stray copy was closed
        left.sendall(b'{"op":"channel","nfds":2}\n')
        with pytest.raises(ProtocolError, match="declares 2 file descriptors but 0 arrived"):
            b.receive()
        left.sendall(b'{"op":"channel","nfds":"two"}\n')
        with pytest.raises(ProtocolError, match="nfds"):
            b.receive()
    finally:
        os.close(spare)
        left.close()
        b.close()


def test_connection_reports_half_messages() -> None:
    left, right = socket.socketpair()
    b = Connection(right)
    left.sendall(b'{"op": "stat')
    left.close()
    with pytest.raises(ProtocolError, match="middle"):
        b.receive()
    b.close()
