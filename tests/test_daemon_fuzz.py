"""A property-based fuzzer of the daemon's socket: random messages, random field values and
random descriptors of every kind, against one real daemon. After every case the daemon is
alive and answers; at the end ``status`` answers within a second and its descriptors and
memory are back near where they started."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

import pytest
from hostile import open_fds, raw, rss_kib

from gpreempt.client.connection import DaemonClient
from gpreempt.control_block import ControlBlock

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPS = ["register", "channel", "status", "hold", "evict", "restore", "detach", "ping", "nope"]
FIELDS = [
    "pid",
    "name",
    "priority",
    "gpus",
    "mechanism",
    "always_active",
    "owned",
    "timeslice_ms",
    "min_share",
    "reserve_bytes",
    "target",
    "hold",
    "register",
    "check",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["high", "low", "normal", "auto", "signal", "gate", "lock", "1", "0"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS), inner),
    max_leaves=8,
)
messages = st.fixed_dictionaries({"op": st.sampled_from(OPS)}, optional={f: values for f in FIELDS})
FD_KINDS = ["sealed", "unsealed", "shrunk", "eventfd", "pipe", "socket", "devnull", "dir"]


def make_fd(kind: str) -> int:
    if kind == "sealed":
        block = ControlBlock.create()
        os.close(block.doorbell)
        return block.memfd  # the mapping in this process goes with the block object
    if kind in ("unsealed", "shrunk"):
        fd = os.memfd_create("fuzz", os.MFD_CLOEXEC)
        os.ftruncate(fd, 64 if kind == "unsealed" else 0)
        return fd
    if kind == "eventfd":
        return os.eventfd(1, os.EFD_CLOEXEC)
    if kind == "pipe":
        r, w = os.pipe()
        os.close(w)
        return r
    if kind == "socket":
        a, b = socket.socketpair()
        b.close()
        return a.detach()
    if kind == "devnull":
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    return os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


class Orphan:
    """A daemon whose parent is not this test (so that this process, not being its
    ancestor, may register itself through a channel), stopped by pid at the end."""

    def __init__(self, runtime_dir: Path) -> None:
        import subprocess
        import sys

        from conftest import gp_env, wait_for

        self.runtime_dir = runtime_dir
        serve = [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime_dir)]
        starter = (
            "import subprocess, sys; "
            "d = subprocess.DEVNULL; "
            "print(subprocess.Popen(sys.argv[1:], stdin=d, stdout=d, stderr=d).pid)"
        )
        out = subprocess.run(
            [sys.executable, "-c", starter, *serve],
            env=gp_env(runtime_dir),
            capture_output=True,
            text=True,
            check=True,
        )
        self.pid = int(out.stdout)
        assert wait_for(self.answers, 10)

    def alive(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().split(") ")[1][0] not in "ZX"
        except FileNotFoundError:
            return False

    def answers(self) -> bool:
        try:
            with DaemonClient.connect(self.runtime_dir, timeout=2) as client:
                return client.ping()["pid"] == self.pid
        except Exception:  # noqa: BLE001 - not yet
            return False

    def stop(self) -> None:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)


@pytest.fixture(scope="module")
def fuzz_daemon():
    import subprocess
    import tempfile

    runtime_dir = Path(tempfile.mkdtemp(prefix="gp-"))
    daemon = Orphan(runtime_dir)
    yield daemon
    daemon.stop()
    subprocess.run(["rm", "-rf", str(runtime_dir)], check=False)


def test_random_messages_and_descriptors_never_hurt_the_daemon(fuzz_daemon: Orphan) -> None:
    daemon = fuzz_daemon
    runtime_dir = daemon.runtime_dir
    pid = daemon.pid
    with DaemonClient.connect(runtime_dir) as client:
        client.status()
    fds_before, rss_before = open_fds(pid), rss_kib(pid)

    @settings(
        max_examples=300,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(
        message=messages,
        kinds=st.lists(st.sampled_from(FD_KINDS), max_size=4),
        declared=st.one_of(st.none(), st.integers(min_value=-1, max_value=6)),
        junk=st.one_of(st.none(), st.binary(max_size=64)),
        shrink=st.booleans(),
    )
    @example(  # the known crash of issue item 1: a block shrunk under the daemon's mapping
        message={"op": "channel", "register": {"priority": "low"}},
        kinds=["unsealed", "eventfd"],
        declared=None,
        junk=None,
        shrink=True,
    )
    @example(  # item 2: a doorbell that reads forever
        message={"op": "channel", "register": {"priority": "low"}},
        kinds=["sealed", "pipe"],
        declared=None,
        junk=None,
        shrink=False,
    )
    def case(
        message: dict, kinds: list[str], declared: int | None, junk: bytes | None, shrink: bool
    ) -> None:
        if declared is not None:
            message = {**message, "nfds": declared}
        elif kinds:
            message = {**message, "nfds": len(kinds)}
        data = json.dumps(message).encode() + b"\n"
        if junk is not None:
            data = junk + b"\n" + data
        fds = [make_fd(kind) for kind in kinds]
        try:
            with raw(runtime_dir, timeout=5) as sock:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_ints(fds)))] if fds else []
                with contextlib.suppress(OSError):
                    sock.sendmsg([data], rights)
                    sock.recv(65536)
                    if shrink:  # what a hostile client does to a block the daemon took
                        for fd in fds:
                            with contextlib.suppress(OSError):
                                os.ftruncate(fd, 0)
                            with contextlib.suppress(OSError):
                                os.eventfd_write(fd, 1)
                        settled(runtime_dir)
                    sock.shutdown(socket.SHUT_WR)
                    while sock.recv(65536):
                        pass
        finally:
            for fd in fds:
                os.close(fd)
        assert daemon.alive(), "the daemon died"

    case()
    start = time.monotonic()
    with DaemonClient.connect(runtime_dir) as client:
        client.status()
        for task in client.status()["tasks"]:  # whatever the fuzzer registered (itself)
            with contextlib.suppress(Exception):
                client.detach(task["pid"])
    assert time.monotonic() - start < 1.0
    time.sleep(0.3)
    assert open_fds(pid) <= fds_before + 2, "descriptors leaked"
    assert rss_kib(pid) < rss_before + 32 * 1024, "memory grew"


def settled(runtime_dir: Path) -> None:
    """Return once the daemon has handled what was sent to it before, and scheduled after it:
    two pings in turn, the second read in a later turn of its loop than whatever was ready
    with the first (a doorbell rung before it), once that turn's scheduling pass is over."""
    with DaemonClient.connect(runtime_dir, timeout=5) as client:
        client.ping()
        client.ping()


def _ints(fds: list[int]) -> bytes:
    import array

    return array.array("i", fds).tobytes()
