"""The control block: a few words of shared memory between a client process and the daemon.

This is the hot path. The in-process gate reads ``gate_closed`` before every launch with a
plain memory load: no syscall, no socket, no lock. The client publishes its activity in
``requests`` and ``auto_active`` and rings the doorbell (an eventfd) only when that changes,
which happens per request, not per launch.

The block itself -- a memfd and its doorbell, how the client makes it and how the daemon
checks and adopts it -- is :class:`gpreempt.control_block.ControlBlock`; this module holds
its layout, the rules that read its words, the client's counters as the daemon reads them
(:class:`ControlStats`), and the read-only views of the blocks a gate watches.

A gate the daemon closed only because a task it watches (:class:`ActivityView`, a read-only
mapping of that task's block; ``gpreempt.policy.watch``) is active resumes by itself the
moment none is, without waiting for the daemon to notice and open it: the daemon then writes
``2V`` instead of ``1``, V being the version of the watch list it sent that connection, so
a gate that has not yet mapped the newest list (a new task to watch) keeps waiting for the
daemon (:func:`released_by_watch`).

Layout (little endian, 144 bytes; ``client/gate/csrc/control_layout.h`` repeats it for the C++
gates, and a test checks every constant there against this table):

======  =====  ==================================================================
offset  type   meaning
======  =====  ==================================================================
0       u32    gate_closed: nonzero = launch nothing (written by the daemon); 1
               (odd) = closed; 2V (V >= 1, even) = only while a watched task is
               active: a gate whose watch list has version V goes on by itself
               once none is
4       u32    generation: bumped by the daemon on every gate change
8       u32    requests: open ``request()`` scopes in the process (client)
12      u32    auto_active: 1 while auto-detected GPU work is in flight (client)
16      u64    launches seen by the gate (client, statistics)
24      u64    waits: times the gate blocked a launch (client, statistics)
32      u64    wait_ns: total nanoseconds blocked (client, statistics)
40      u32    window: in-flight bound the gate uses (client, statistics)
44      u32    gate_installed: 1 once an in-process gate watches launches, or stream
               barriers alone hold the process's queued work (client)
48      u32    hinted: 1 once the process used ``request()`` or a marker of whole
               requests; from then on its requests alone say when it is active (client)
52      u32    window_share_us: GPU time (us) the gate may keep in flight while
               tight, this task's share of its GPU's budget; while it is set the
               gate stays tight; 0 = no limit from the daemon (daemon)
56      u32    sleep_ok: 1 while nobody more important on the task's GPU has been
               active for a while: the gate may disable its operator hook until
               this drops, its gate closes or a watched task starts (daemon)
60      u32    barriers_on: 1 while the gate puts stream barriers, which hold its
               queued work on the GPU; the daemon's driver-lock backstop then
               leaves the task alone (client)
64      u32    driver_gate: the driver-level gate (CUPTI) of the process: 0 none,
               1 on (sees and holds every launch), 2 unavailable (CUPTI's
               subscriber was taken), 3 released to a profiler, 4 failed (CUPTI could
               not be set up, or a stream barrier could not be put) (client)
68      u32    driver_asleep: the driver-level gate's callbacks are off, its thread
               putting its barriers: 1 asleep (nobody more important was active for a
               while), 2 paced (its process queues no faster than its GPU runs),
               3 detached (asleep, a task nothing preempts: CUPTI let go);
               0 while they are on (client)
72      u64    driver_launches: launches the driver-level gate saw (client)
80      u64    driver_waits: launches it held (client)
88      u64    driver_wait_ns: nanoseconds they were held (client)
96      u64    driver_barriers: stream barriers it put (client)
104     u32    driver_streams: streams it follows (client)
108     u32    activity_epoch: bumped each time ``requests`` or ``auto_active`` rises from 0
               (client): a gate that saw a watched task active twice with one epoch knows
               it stayed active in between
112     u32    barrier_leaks: times the driver-level gate saw its GPU work pass a stream
               barrier while a watched task stayed active (client)
116     u32    driver_ns_per_launch: the GPU time per launch the driver-level gate last
               learned on a stream, in ns; it spaces the barriers and bounds the work in
               flight (client, statistics)
120     u32    driver_bound_waits: times a launch waited because more than the window was
               in flight (client, statistics)
124     u32    marker: what marks the process's requests without code (client):
               0 none, 1 ``asgi`` (an ASGI server's requests), 2 ``grpc`` (a gRPC
               server's), 3 ``generate`` (Hugging Face generate calls); :data:`MARKERS`
128     u64    devices: bit N set once the process made a CUDA context on the GPU of
               physical index N (the driver-level gate; the index read through
               ``CUDA_VISIBLE_DEVICES`` as for ranks, bits 0-63): the daemon counts
               the task on each such GPU it can use (client)
136     u32    quiet: 1 while every task this one outranks holds itself on this
               task's words (its gate watches them): a request that raises the
               ``requests`` word may leave the doorbell to the process's request
               counter's helper, at most 0.25 ms later, instead of ringing it (daemon)
140     u32    barriers_checked: stream barriers of the driver-level gate whose pass its
               GPU-side check could date (their word read raised before the GPU reached
               them), leaked or not: the check at work (client, statistics)
======  =====  ==================================================================
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

SIZE = 144

OFF_GATE_CLOSED = 0
OFF_GENERATION = 4
OFF_REQUESTS = 8
OFF_AUTO_ACTIVE = 12
OFF_LAUNCHES = 16
OFF_WAITS = 24
OFF_WAIT_NS = 32
OFF_WINDOW = 40
OFF_GATE_INSTALLED = 44
OFF_HINTED = 48
OFF_WINDOW_SHARE_US = 52
OFF_SLEEP_OK = 56
OFF_BARRIERS_ON = 60
OFF_DRIVER_GATE = 64
OFF_DRIVER_ASLEEP = 68
OFF_DRIVER_LAUNCHES = 72
OFF_DRIVER_WAITS = 80
OFF_DRIVER_WAIT_NS = 88
OFF_DRIVER_BARRIERS = 96
OFF_DRIVER_STREAMS = 104
OFF_ACTIVITY_EPOCH = 108
OFF_BARRIER_LEAKS = 112
OFF_DRIVER_NS_PER_LAUNCH = 116
OFF_DRIVER_BOUND_WAITS = 120

#: ``driver_gate`` values.
DRIVER_NONE, DRIVER_ON, DRIVER_UNAVAILABLE, DRIVER_RELEASED, DRIVER_FAILED = range(5)
DRIVER_STATES = ("none", "on", "unavailable", "released", "failed")

OFF_MARKER = 124

#: ``marker`` word -> the name ``status`` gives it.
MARKERS = {1: "asgi", 2: "grpc", 3: "generate"}

OFF_DEVICES = 128
OFF_QUIET = 136
OFF_BARRIERS_CHECKED = 140


#: ``gate_closed`` of a plain closed gate: it waits for the daemon to open it. Odd, so that a
#: stream barrier can wait for bit 0 alone (docs/gate.md).
CLOSED = 1


def closed_while_watched(version: int) -> int:
    """``gate_closed`` for a gate closed only while the tasks of watch list ``version`` (>= 1)
    are active: even, bit 0 clear."""
    if not 1 <= version < 2**31:
        raise ValueError(f"watch list versions run from 1 to 2**31 - 1, got {version}")
    return 2 * version


def released_by_watch(word: int, version: int, watched_active: bool) -> bool:
    """Whether a gate whose ``gate_closed`` reads ``word`` may launch by itself: the daemon
    closed it only while its watched tasks are active, the gate watches exactly that list
    (``version``, 0 = none or incomplete), and none of them is active. The native gate has the
    same rule."""
    ours = word != 0 and word % 2 == 0 and version > 0 and word // 2 == version
    return ours and not watched_active


def wants_gpu(requests: int, auto_active: int, hinted: int) -> bool:
    """The activity rule, from a block's three words: a process that marks its requests
    explicitly is active exactly inside them; its automatic activity (which lasts a grace
    period past each burst) then no longer counts. The native gate has the same rule."""
    return requests > 0 or (auto_active != 0 and hinted == 0)


@dataclass(frozen=True)
class ControlStats:
    """The client's counters, as read by the daemon."""

    requests: int
    auto_active: bool
    launches: int
    waits: int
    wait_seconds: float
    window: int
    gate_installed: bool
    driver_gate: str = "none"  # one of DRIVER_STATES
    driver_launches: int = 0
    driver_waits: int = 0
    driver_barriers: int = 0
    driver_asleep: bool = False  # callbacks off: nobody more important active for a while
    driver_paced: bool = False  # callbacks off: its process queues no faster than its GPU runs
    driver_detached: bool = False  # asleep, CUPTI let go: a task nothing preempts
    driver_us_per_launch: float = 0.0  # the GPU time per launch it last learned on a stream
    driver_bound_waits: int = 0  # launches that waited for the work in flight to drain
    driver_barriers_checked: int = 0  # barriers whose pass the GPU-side check could date


def driver_modes(word: int) -> dict[str, bool]:
    """The ``driver_asleep`` word as :class:`ControlStats`' flags (detached is asleep too)."""
    asleep, paced, detached = word in (1, 3), word == 2, word == 3
    return {"driver_asleep": asleep, "driver_paced": paced, "driver_detached": detached}


_PROT_READ = 1
_MAP_SHARED = 1
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def words_want_gpu(words: Any) -> bool:
    """:func:`wants_gpu` of a block seen as a sequence of its u32 words."""
    return wants_gpu(words[OFF_REQUESTS // 4], words[OFF_AUTO_ACTIVE // 4], words[OFF_HINTED // 4])


class ActivityView:
    """A read-only mapping of another task's control block (client side of a watch).

    The gate reads the block's activity words at :attr:`address`; :meth:`is_active` says the
    same from Python (the fallback gate, tests). Mapped with ``PROT_READ`` through libc so the
    address is stable and writing through it faults.
    """

    def __init__(self, fd: int) -> None:
        address = _libc.mmap(None, SIZE, _PROT_READ, _MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"cannot map a watched control block: {os.strerror(err)}")
        self.address: int = address
        words = (ctypes.c_uint32 * (SIZE // 4)).from_address(address)
        self._words = memoryview(words).cast("B").cast("I")  # indexing it is cheap

    def is_active(self) -> bool:
        """The watched task wants the GPU, by :func:`wants_gpu`."""
        return words_want_gpu(self._words)

    def close(self) -> None:
        """Unmap. Only once no gate reads :attr:`address` any more."""
        if self.address:
            self._words.release()
            _libc.munmap(ctypes.c_void_p(self.address), SIZE)
            self.address = 0
