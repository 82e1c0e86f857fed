"""The Python fallback gate's work in flight: its CUDA events and the GPU time per launch.

A bounded gate records a timed CUDA event every few launches. :class:`InflightEvents` keeps
them in order, retires the completed ones (learning the GPU time per launch from their
timestamps) and waits for the oldest while more launches than the window are in flight. The
C++ gate does the same in ``csrc/operator_gate_window.cpp`` (``segment``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any


class InflightEvents:
    """The events a bounded fallback gate has in flight, oldest first. Not thread-safe: the
    gate calls it under its lock."""

    def __init__(self) -> None:
        # (event, begin, mark, backlogged): the launches begin..mark, and whether the event
        # before it was still pending when it was recorded (see _retire_front)
        self.fifo: deque[tuple[Any, int, int, bool]] = deque()
        self._done: tuple[Any, int] | None = None  # the last retired event and its mark
        self.ns_per_launch = 0.0  # learned GPU time per launch (an exponential average)
        self.recorded = 0
        self.bound_waits = 0
        self.bound_wait_ns = 0

    def record(self, cuda: Any, stream: Any, mark: int) -> None:
        """Record an event on ``stream`` after launch ``mark``, then retire completed ones."""
        begin = self.fifo[-1][2] if self.fifo else (self._done[1] if self._done else mark)
        event = cuda.Event(enable_timing=True)
        event.record(stream)
        backlogged = bool(self.fifo) and not self.fifo[-1][0].query()
        self.fifo.append((event, begin, mark, backlogged))
        self.recorded += 1
        self.reap()

    def wait_within(self, launches: int, window: int) -> None:
        """Wait for the oldest events until at most ``window`` launches before ``launches``
        are in flight; a wait counts in ``bound_waits``."""
        waited_from = 0
        while self.fifo and launches - self.fifo[0][1] > window:
            waited_from = waited_from or time.monotonic_ns()
            self.fifo[0][0].synchronize()
            self._retire_front()
        if waited_from:
            self.bound_waits += 1
            self.bound_wait_ns += time.monotonic_ns() - waited_from

    def reap(self) -> None:
        """Retire the events that have completed."""
        while self.fifo and self.fifo[0][0].query():
            self._retire_front()

    def _retire_front(self) -> None:
        # Only a segment recorded while the previous event was still pending measures GPU
        # time: in any other the stream ran dry (the gate was closed, the CPU was slow) and the
        # time between the two events counts idle time too.
        event, _begin, mark, backlogged = self.fifo.popleft()
        if backlogged and self._done is not None and mark > self._done[1]:
            try:
                per = self._done[0].elapsed_time(event) * 1e6 / (mark - self._done[1])
            except RuntimeError:  # events on different streams or devices
                per = -1.0
            if per >= 0:
                self.ns_per_launch = (
                    per if self.ns_per_launch <= 0 else 0.8 * self.ns_per_launch + 0.2 * per
                )
        self._done = (event, mark)
