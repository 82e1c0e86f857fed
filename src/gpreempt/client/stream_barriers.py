"""Stream barriers for a process that launches its GPU work without PyTorch (CuPy, say).

Such a process has no launch gate: the daemon could only lock it in the driver, and a lock
waits for everything the program queued, which for a loop that runs ahead is the whole
launch queue (a hundred milliseconds and more) while the server it makes way for waits. So
under ``gpreempt run`` a less important Python process that imports CuPy gets a thread that,
once the program has made its CUDA context and while a more important task is registered
on the GPU, puts a barrier on the legacy default stream every :data:`SPACING_S`: waits, run
by the GPU, for the process's own ``gate_closed`` word and for the activity words of the
tasks that outrank it, the same barrier the launch gate puts (``docs/gate.md``).

The thread's waits enter the stream in order with the program's own work, so once the
queue is full (a loop that runs ahead fills it and then launches as fast as the GPU
finishes) a barrier lies every :data:`SPACING_S` of queued work: the GPU stops at the next
one the moment the server starts, and goes on the moment it ends, with no daemon and no CPU
in between. The program's CPU is not stopped; its launches block once the queue is full.
Work on the legacy stream and on every blocking stream (CuPy's default and its
``cupy.cuda.Stream()``) waits behind a barrier; work on non-blocking streams does not.

The control block then says ``gate_installed`` and ``barriers_on``: the daemon closes the
gate word instead of locking the process, and its driver-lock backstop leaves it alone.
A failed driver call turns the barriers off for good, clears both words (the daemon goes
back to the lock) and says so on stderr. Where they cannot start at all (no NVIDIA driver
with stream memory operations: CuPy on ROCm, say, whose barriers would need HIP's
``hipStreamWaitValue32`` on signal memory or a writable mapping, see ``gate/csrc/hip_api.h``), they
say so on stderr too: the process then runs unheld by barriers, never silently.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Sequence
from typing import Protocol

from ..control import CLOSED, OFF_AUTO_ACTIVE, OFF_GATE_CLOSED, OFF_HINTED, OFF_REQUESTS
from ..control_block import ControlBlock
from .cuda_stream_ops import WAIT_EQ, WAIT_NOR, CudaStreamOps

#: Wall time between two barriers while a more important task is registered on the GPU.
SPACING_S = 0.001
#: How often the thread looks for the program's CUDA context, and for a more important task.
POLL_S = 0.02


class StreamOps(Protocol):
    """What the thread needs of the driver (:class:`~.cuda_stream_ops.CudaStreamOps`)."""

    def active_devices(self) -> list[int]: ...
    def push_context(self, ordinal: int) -> None: ...
    def pop_context(self) -> None: ...
    def device_word(self, address: int, read_only: bool) -> int: ...
    def wait32(self, device_address: int, value: int, how: int) -> None: ...


class StreamBarriers:
    """The barrier thread of one process (see the module's docstring)."""

    def __init__(self, control: ControlBlock, ops: StreamOps, spacing_s: float = SPACING_S) -> None:
        self.control = control
        self.spacing_s = spacing_s
        self._ops = ops
        self._lock = threading.Lock()
        self._watched: tuple[int, ...] = ()
        self._version = 0
        self._devices: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpreempt-barriers", daemon=True)
        #: Barriers put so far, and why they stopped (None while they go on).
        self.barriers_put = 0
        self.error: str | None = None

    @classmethod
    def start_for(cls, control: ControlBlock) -> StreamBarriers | None:
        """Start the thread for ``control``'s process; None where the driver has no stream
        memory operations (no NVIDIA driver, an old one)."""
        ops = CudaStreamOps.load()
        if ops is None:
            print(
                "gpreempt: stream barriers not started: no NVIDIA driver with stream memory "
                "operations (the daemon holds this process by its mechanism alone)",
                file=sys.stderr,
            )
            return None
        barriers = cls(control, ops)
        barriers.start()
        return barriers

    def start(self) -> None:
        self.control.keep_mapped()  # queued waits read its page until the process ends
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop putting barriers (those queued still wait for their words)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def watch(self, addresses: Sequence[int], version: int) -> None:
        """Watch the activity words of the blocks mapped at ``addresses`` (the daemon's list
        ``version``; 0: incomplete, the own word then waits for the daemon to open it)."""
        with self._lock:
            self._watched = tuple(addresses)
            self._version = version

    def _run(self) -> None:
        try:
            while not self._devices:
                if self._stop.wait(POLL_S):
                    return
                self._devices = self._ops.active_devices()
            self.control.set_barriers_on(True)
            while not self._stop.is_set():
                if not self.due():
                    self._stop.wait(POLL_S)
                    continue
                self.put()
                self._stop.wait(self.spacing_s)
        except Exception as exc:  # a driver call failed: the daemon goes back to the lock
            self.error = str(exc)
            self.control.set_barriers_on(False)
            print(f"gpreempt: stream barriers stopped: {exc}", file=sys.stderr)

    def due(self) -> bool:
        """Whether barriers are wanted now: a more important task is registered on the GPU
        (the daemon gives this task an in-flight share), or the daemon closed the gate."""
        return self.control.window_share_ms is not None or self.control.gate_word != 0

    def put(self) -> None:
        """Queue one barrier on the legacy stream of each device the program uses."""
        with self._lock:
            watched, version = self._watched, self._version
        ops = self._ops
        own = self.control.address + OFF_GATE_CLOSED
        for ordinal in self._devices:
            ops.push_context(ordinal)
            try:
                # the own word: plainly closed (bit 0) holds; with a complete list, 2V (closed
                # only while the watched tasks are active) is left to the waits below
                if version:
                    ops.wait32(ops.device_word(own, False), ~CLOSED, WAIT_NOR)
                else:
                    ops.wait32(ops.device_word(own, False), 0, WAIT_EQ)
                for block in watched:
                    ops.wait32(ops.device_word(block + OFF_REQUESTS, True), 0, WAIT_EQ)
                    if not _word(block + OFF_HINTED):  # its automatic activity counts too
                        ops.wait32(ops.device_word(block + OFF_AUTO_ACTIVE, True), 0, WAIT_EQ)
            finally:
                ops.pop_context()
        self.barriers_put += 1


def _word(address: int) -> int:
    """The u32 at ``address`` (a mapped control block)."""
    return ctypes.c_uint32.from_address(address).value
