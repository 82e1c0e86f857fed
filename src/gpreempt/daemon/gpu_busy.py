"""Whether a held task's processes still use the GPU, by NVML's per-process samples: a sign
that its hold leaks which no client can write.

The launch counts a gate keeps are the client's word, and the CPU time the kernel counts
(hold_meter.py) misses a process whose GPU work goes on at little cost to its CPU. NVML samples
each process's share of the SMs now and then (a few times a second); once a gate has held its
task outright for :data:`~.backstop_plan.GPU_SETTLE_S`, what it had queued has long completed,
so a sample that still shows one of its processes on the SMs says its work goes on.

The samples are read by a thread of its own, only while the backstop names GPUs to watch (some
task has been held outright for ``backstop.WATCH_AFTER_S``), never on the daemon's loop; NVML
is opened on the first such need, and where it cannot be (no ``nvidia-ml-py``, no NVIDIA
driver) nothing is watched. The samples are coarse: a leak shorter than a sampling period, or
one too small to register as SM use, goes unseen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

#: How often the watched GPUs' samples are read (s).
PERIOD_S = 0.25
#: How long a process's last busy sample is kept (s).
KEEP_S = 60.0


class GpuBusy:
    """The latest time NVML saw each process on a watched GPU's SMs.

    ``open_nvml``: opens NVML (:func:`gpreempt.nvml.open_nvml`; tests pass a fake); ``clock``:
    unix time.
    """

    def __init__(
        self,
        open_nvml: Callable[[], Any] | None = None,
        period_s: float = PERIOD_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._open = open_nvml
        self.period_s = period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._wanted: frozenset[int] = frozenset()
        self._seen: dict[int, float] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: Why nothing is watched (NVML could not be opened), once known.
        self.unavailable: str | None = None

    def watch(self, gpus: Iterable[int]) -> None:
        """Read the samples of ``gpus`` from now on (none: stop reading)."""
        wanted = frozenset(gpus)
        with self._lock:
            changed, self._wanted = wanted != self._wanted, wanted
        if wanted and self._thread is None and self.unavailable is None:
            self._thread = threading.Thread(target=self._run, name="gpreempt-nvml", daemon=True)
            self._thread.start()
        if changed:
            self._wake.set()

    def busy_after(self, pids: Iterable[int], when: float) -> bool:
        """Whether NVML saw one of ``pids`` on the SMs after unix time ``when``."""
        with self._lock:
            return any(self._seen.get(pid, 0.0) > when for pid in pids)

    def read(self, nv: Any, gpus: Iterable[int], since: float) -> None:
        """Take in the samples of ``gpus`` after ``since`` (one pass of the thread)."""
        now = self._clock()
        for gpu in gpus:
            busy = nv.sm_busy(gpu, since)
            if not isinstance(busy, dict):
                continue  # this GPU's samples cannot be read now
            with self._lock:
                for pid, at in busy.items():
                    self._seen[pid] = max(self._seen.get(pid, 0.0), at)
        with self._lock:
            self._seen = {pid: at for pid, at in self._seen.items() if at > now - KEEP_S}

    def _run(self) -> None:
        if self._open is None:
            from ..nvml import open_nvml

            self._open = open_nvml
        nv = self._open()
        if not hasattr(nv, "sm_busy"):
            self.unavailable = str(getattr(nv, "reason", nv))
            return
        last = self._clock() - self.period_s
        while True:
            with self._lock:
                wanted = self._wanted
            if not wanted:
                self._wake.wait()
                self._wake.clear()
                last = self._clock() - self.period_s
                continue
            now = self._clock()
            self.read(nv, sorted(wanted), last - self.period_s)  # overlapping: none lost
            last = now
            self._wake.wait(self.period_s)
            self._wake.clear()
