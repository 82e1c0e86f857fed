"""GPU utilisation and memory, per device and per process, sampled while a scenario runs.

Uses NVML through the project's one NVML module (:mod:`gpreempt.nvml`); without
nvidia-ml-py or a GPU every number is reported as "n/a" instead of failing the run.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

from ..nvml import NA, open_nvml


class NvmlSampler:
    """Samples GPU ``index`` every ``interval_s`` on a thread, between start() and stop()."""

    def __init__(self, index: int = 0, interval_s: float = 0.1) -> None:
        self.index = index
        self.interval_s = interval_s
        self.unavailable: str | None = None
        self.device: list[tuple[float, float, float]] = []  # (gpu %, mem-bandwidth %, used MiB)
        self.proc_mem: dict[int, float] = {}  # pid -> max used MiB
        self.proc_sm: dict[int, list[float]] = {}  # pid -> SM % samples
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        session = open_nvml()
        if isinstance(session, NA):
            self.unavailable = f"NVML unavailable: {session.reason}"
        else:
            self._nvml = session

    def start(self) -> None:
        if self._nvml is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            info = self._nvml.gpu(self.index, with_processes=True)
            if not isinstance(info.util_gpu, NA) and not isinstance(info.memory_used, NA):
                util_memory = 0.0 if isinstance(info.util_memory, NA) else info.util_memory
                self.device.append(
                    (float(info.util_gpu), float(util_memory), info.memory_used / 2**20)
                )
            for proc in info.processes if isinstance(info.processes, list) else []:
                if not isinstance(proc.used_memory, NA):
                    used = proc.used_memory / 2**20
                    self.proc_mem[proc.pid] = max(self.proc_mem.get(proc.pid, 0.0), used)
                if not isinstance(proc.sm_util, NA):
                    self.proc_sm.setdefault(proc.pid, []).append(float(proc.sm_util))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._nvml is not None:
            self._nvml.close()  # one sampler per scenario: its NVML session ends with it
            self._nvml = None

    def summary(self, roles: dict[int, str] | None = None) -> dict[str, Any] | str:
        """Means and maxima of what was sampled; "n/a" where NVML was missing."""
        if self.unavailable:
            return "n/a"
        roles = roles or {}
        processes = {}
        for pid in sorted(set(self.proc_mem) | set(self.proc_sm)):
            sm = self.proc_sm.get(pid)
            processes[str(pid)] = {
                "role": roles.get(pid, "other"),
                "sm_util_mean": statistics.fmean(sm) if sm else None,
                "mem_used_mib_max": self.proc_mem.get(pid),
            }
        return {
            "samples": len(self.device),
            "device_util_mean": statistics.fmean(d[0] for d in self.device)
            if self.device
            else None,
            "device_mem_bw_util_mean": (
                statistics.fmean(d[1] for d in self.device) if self.device else None
            ),
            "device_mem_used_mib_max": max((d[2] for d in self.device), default=None),
            "processes": processes,
        }
