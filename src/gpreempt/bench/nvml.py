"""GPU utilisation and memory, per device and per process, sampled while a scenario runs.

Uses NVML through nvidia-ml-py when it is installed; without it (or without a GPU) every
number is reported as "n/a" instead of failing the run.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any


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
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # ImportError, NVMLError: no NVML here
            self.unavailable = f"NVML unavailable: {exc}"

    def start(self) -> None:
        if self.unavailable:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nvml, handle = self._nvml, self._handle
        last_ts = int(time.time() * 1e6)
        while not self._stop.wait(self.interval_s):
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                self.device.append((float(util.gpu), float(util.memory), mem.used / 2**20))
            except Exception:
                pass
            try:
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = (proc.usedGpuMemory or 0) / 2**20
                    self.proc_mem[proc.pid] = max(self.proc_mem.get(proc.pid, 0.0), used)
            except Exception:
                pass
            try:
                for sample in nvml.nvmlDeviceGetProcessUtilization(handle, last_ts):
                    self.proc_sm.setdefault(sample.pid, []).append(float(sample.smUtil))
                    last_ts = max(last_ts, int(sample.timeStamp))
            except Exception:
                pass  # NVML_ERROR_NOT_FOUND when no sample is new

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

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
