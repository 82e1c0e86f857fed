"""Small pieces: priorities, sizes, GPU lists, the wire format, the control block, its wake-up."""

from __future__ import annotations

import array
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from gpreempt import futex
from gpreempt.cli._task_options import parse_gpus, parse_size
from gpreempt.control import ControlBlock
from gpreempt.errors import NoSuchTask, PriorityError, ProtocolError, UsageError
from gpreempt.priority import parse_priority, priority_name
from gpreempt.protocol import MAX_MESSAGE, Connection, decode, encode, raise_for_reply


@pytest.mark.parametrize(
    "text, value",
    [
        ("high", 100),
        ("HIGH", 100),
        (" normal ", 0),
        ("low", -100),
        ("255", 255),
        ("-255", -255),
        (7, 7),
        ("0", 0),
    ],
)
def test_priorities(text, value) -> None:
    assert parse_priority(text) == value


@pytest.mark.parametrize("bad", ["urgent", "256", "-256", "1.5", "", True, None, 3.0])
def test_bad_priorities(bad) -> None:
    with pytest.raises(PriorityError):
        parse_priority(bad)


def test_priority_names() -> None:
    assert priority_name(100) == "high" and priority_name(42) == "42"


@pytest.mark.parametrize(
    "text, size",
    [
        ("20GiB", 20 << 30),
        ("512MiB", 512 << 20),
        ("4G", 4_000_000_000),
        ("1.5g", 1_500_000_000),
        ("1024", 1024),
        ("3kb", 3000),
        ("", 0),
        (None, 0),
    ],
)
def test_sizes(text, size) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["lots", "20 GiBs", "-1G", "G"])
def test_bad_sizes(bad) -> None:
    with pytest.raises(UsageError):
        parse_size(bad)


def test_gpu_lists(monkeypatch) -> None:
    assert parse_gpus("0,1") == (0, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    assert parse_gpus(None) == (3,)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert parse_gpus(None) == (0,)
    for bad in ("x", "-1", ","):
        with pytest.raises(UsageError):
            parse_gpus(bad)


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


def test_explicit_requests_take_precedence_over_automatic_activity() -> None:
    block = ControlBlock.create()
    try:
        block.set_auto_active(True)
        assert block.is_active()  # automatic activity alone counts
        block.set_requests(1)
        block.set_requests(0)
        assert not block.is_active()  # once hinted, only open requests count
        block.set_requests(1)
        assert block.is_active()
    finally:
        block.close()


def test_status_table_shows_evicted_memory(capsys, monkeypatch) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", "200")
    task = {
        "pid": 5,
        "name": "trainer",
        "priority": -100,
        "priority_name": "low",
        "gpus": [0],
        "mechanism": "auto",
        "state": "evicted",
        "active": False,
        "preemptions": 3,
        "suspended_seconds": 1.5,
        "last_suspend_ms": 0.02,
        "last_mechanism": "lock",
        "evicted_bytes": 32 * 2**30,
    }
    daemon = {"pid": 1, "policy": "hpf", "runtime_dir": "/tmp/x", "lock_available": True}
    print_status({"daemon": daemon, "tasks": [task]})
    out = capsys.readouterr().out
    assert "on host GiB" in out and "32.00" in out and "evicted" in out


def test_event_log_rotates_and_keeps_one_previous_generation(tmp_path) -> None:
    from gpreempt.daemon.events import EventLog, read_all_events, rotated_path

    path = tmp_path / "events.jsonl"
    log = EventLog(path, max_bytes=1000)
    for n in range(60):
        log.write("active", task="a", n=n)
    with log.batch():  # a batch is written whole, then rotated
        for n in range(60, 70):
            log.write("idle", task="a", n=n)
    log.close()
    old = rotated_path(path)
    assert old.exists() and old.stat().st_size > 1000 >= path.stat().st_size
    assert path.stat().st_mode & 0o777 == 0o600 and old.stat().st_mode & 0o777 == 0o600
    seen = [e["n"] for e in read_all_events(path)]
    assert seen == list(range(seen[0], 70)) and seen[0] > 0  # in order, the oldest dropped


def test_following_the_event_log_goes_on_across_a_rotation(tmp_path) -> None:
    from gpreempt.daemon.events import EventLog, follow_events

    path = tmp_path / "events.jsonl"
    log = EventLog(path, max_bytes=600)
    log.write("daemon-start")
    seen: list[int] = []

    def follow() -> None:
        for record in follow_events(path, poll_s=0.005):
            seen.append(record["n"])
            if record["n"] == 19:
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    time.sleep(0.3)  # it starts at the end of the file
    for n in range(20):
        log.write("active", task="a", n=n)
        time.sleep(0.03)
    follower.join(10)
    log.close()
    assert seen == list(range(20))


def test_event_log_batch_writes_at_the_end_in_order(tmp_path) -> None:
    from gpreempt.daemon.events import EventLog, parse_event

    log = EventLog(tmp_path / "events.jsonl")
    log.write("registered", task="a")
    with log.batch():
        log.write("active", task="b")
        with log.batch():  # nested: still held by the outer batch
            log.write("suspend", task="a")
        assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 1
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [parse_event(line)["event"] for line in lines] == ["registered", "active", "suspend"]
    log.write("resume", task="a")  # after the batch: written at once again
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 4
    log.close()


_FUTEX_WAITER = """
import ctypes, mmap, sys, time
from gpreempt import futex
fd = int(sys.argv[1])
block = mmap.mmap(fd, 64)
address = ctypes.addressof(ctypes.c_char.from_buffer(block))
print("waiting", flush=True)
start = time.monotonic()
futex.wait(address, 1, 20.0)
print(f"{time.monotonic() - start:.3f}", flush=True)
"""


@pytest.mark.skipif(not futex.available(), reason="no futex system call known on this machine")
def test_opening_a_gate_wakes_a_waiter_in_another_process() -> None:
    block = ControlBlock.create()
    block.set_gate(True)
    child = subprocess.Popen(
        [sys.executable, "-c", _FUTEX_WAITER, str(block.memfd)],
        pass_fds=(block.memfd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # let it reach the wait
        block.set_gate(False)
        waited = float(child.stdout.readline())
        assert waited < 5.0  # woken by the open, not by its 20 s timeout
    finally:
        child.kill()
        child.wait()
        block.close()


@pytest.mark.skipif(not futex.available(), reason="no futex system call known on this machine")
def test_futex_wait_times_out_and_returns_at_once_if_the_word_differs() -> None:
    block = ControlBlock.create()
    try:
        block.set_gate(True)
        start = time.monotonic()
        futex.wait(block.address, 1, 0.05)
        assert 0.04 < time.monotonic() - start < 2.0
        start = time.monotonic()
        futex.wait(block.address, 0, 5.0)  # the word is 1, not 0
        assert time.monotonic() - start < 1.0
    finally:
        block.close()


def test_futex_wake_without_waiters_or_address_is_harmless() -> None:
    block = ControlBlock.create()
    try:
        assert futex.wake(block.address) == 0
        assert futex.wake(0) == 0
    finally:
        block.close()


def test_a_watch_view_is_read_only_and_follows_the_activity_rule() -> None:
    import mmap
    import os

    from gpreempt.control import SIZE, ActivityView

    block = ControlBlock.create()
    fd = block.read_only_fd()
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fd, SIZE)  # writable mapping of a read-only descriptor
        view = ActivityView(fd)
        assert not view.is_active()
        block.set_auto_active(True)
        assert view.is_active()  # automatic activity counts until request() is used
        block.set_requests(1)
        block.set_requests(0)
        assert not view.is_active()  # hinted: requests alone count
        block.set_requests(2)
        assert view.is_active()
        block.clear_activity()  # what the daemon does when the owner goes away
        assert not view.is_active()
        view.close()
        view.close()  # twice is harmless
    finally:
        os.close(fd)
        block.close()
