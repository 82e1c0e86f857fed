"""The one place gpreempt talks to NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every query goes through :func:`_call`, which turns a missing library, a missing driver, a
function this NVML lacks, an unsupported query or a process that vanished into an :class:`NA`
value carrying the reason. Nothing here raises for a query the GPU cannot answer, so views
built on it (``gpreempt top``, ``gpreempt queues``) show "n/a" and go on.

Tests pass a fake module with the same names (``nvmlInit``, ``NVMLError``, ...).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NA:
    """A value NVML could not give, and why ("not supported", "no driver", ...)."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return "n/a"


def value(x: Any) -> Any:
    """``x`` itself, or None for an NA (for JSON)."""
    return None if isinstance(x, NA) else x


def na_reason(x: Any) -> str | None:
    return x.reason if isinstance(x, NA) else None


@dataclass
class GpuProcess:
    pid: int
    name: str | NA
    #: Device memory the process holds, bytes.
    used_memory: int | NA
    #: SM utilisation of this process over the last sample window, percent.
    sm_util: int | NA
    kind: str = "compute"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "name": value(self.name),
            "used_memory": value(self.used_memory),
            "sm_util": value(self.sm_util),
            "kind": self.kind,
        }


@dataclass
class GpuInfo:
    index: int
    name: str | NA
    uuid: str | NA
    util_gpu: int | NA
    util_memory: int | NA
    memory_used: int | NA
    memory_total: int | NA
    processes: list[GpuProcess] | NA = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        procs = self.processes
        return {
            "index": self.index,
            "name": value(self.name),
            "uuid": value(self.uuid),
            "util_gpu": value(self.util_gpu),
            "util_memory": value(self.util_memory),
            "memory_used": value(self.memory_used),
            "memory_total": value(self.memory_total),
            "processes": [p.to_dict() for p in procs] if not isinstance(procs, NA) else None,
            "processes_na": na_reason(procs),
        }


@dataclass
class NvmlSnapshot:
    gpus: list[GpuInfo]
    #: Set when NVML itself is unusable (no library, no driver): then ``gpus`` is empty.
    unavailable: str | None = None
    driver_version: str | NA | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.unavailable is None,
            "reason": self.unavailable,
            "driver_version": value(self.driver_version),
            "gpus": [g.to_dict() for g in self.gpus],
        }


class Nvml:
    """A session with NVML. Use :func:`open_nvml`; ``close()`` when done."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def _call(self, fn_name: str, *args: Any) -> Any:
        """Call ``lib.fn_name(*args)``; an NA with the reason instead of any NVML error."""
        fn: Callable[..., Any] | None = getattr(self.lib, fn_name, None)
        if not callable(fn):
            return NA(f"{fn_name} not in this nvidia-ml-py")
        try:
            return fn(*args)
        except Exception as exc:  # NVMLError and its subclasses, or a vanished handle
            return NA(_describe(self.lib, exc))

    def device_count(self) -> int | NA:
        return self._call("nvmlDeviceGetCount")

    def driver_version(self) -> str | NA:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def gpu(self, index: int, with_processes: bool = True) -> GpuInfo:
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        if isinstance(handle, NA):
            return GpuInfo(index, handle, handle, handle, handle, handle, handle, handle)
        util = self._call("nvmlDeviceGetUtilizationRates", handle)
        mem = self._call("nvmlDeviceGetMemoryInfo", handle)
        info = GpuInfo(
            index=index,
            name=_text(self._call("nvmlDeviceGetName", handle)),
            uuid=_text(self._call("nvmlDeviceGetUUID", handle)),
            util_gpu=util if isinstance(util, NA) else int(util.gpu),
            util_memory=util if isinstance(util, NA) else int(util.memory),
            memory_used=mem if isinstance(mem, NA) else int(mem.used),
            memory_total=mem if isinstance(mem, NA) else int(mem.total),
        )
        if with_processes:
            info.processes = self.processes(handle)
        return info

    def processes(self, handle: Any) -> list[GpuProcess] | NA:
        """Compute processes on a GPU with their memory and recent SM utilisation."""
        fn = "nvmlDeviceGetComputeRunningProcesses"
        procs = self._call(fn, handle)
        if isinstance(procs, NA):
            return procs
        samples = self._call(
            "nvmlDeviceGetProcessUtilization", handle, int((time.time() - 2.0) * 1e6)
        )
        sm: dict[int, int] = {}
        if not isinstance(samples, NA):
            for s in samples:
                sm[int(s.pid)] = max(sm.get(int(s.pid), 0), int(s.smUtil))
        out = []
        for p in procs:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            if used is None:
                used_value: int | NA = NA("not reported (no permission or MIG)")
            else:
                used_value = int(used)
            if isinstance(samples, NA):
                util: int | NA = samples
            else:
                util = sm.get(pid, 0)
            out.append(GpuProcess(pid, process_name(pid), used_value, util))
        return out

    def sm_busy(self, index: int, since: float) -> dict[int, float] | NA:
        """Process id -> the latest time (unix seconds) after ``since`` at which NVML's
        samples saw it use the SMs of GPU ``index`` (none sampled: an empty answer)."""
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        if isinstance(handle, NA):
            return handle
        samples = self._call("nvmlDeviceGetProcessUtilization", handle, int(since * 1e6))
        if isinstance(samples, NA):
            return {} if "not found" in samples.reason.lower() else samples
        busy: dict[int, float] = {}
        for sample in samples:
            if int(sample.smUtil) > 0:
                pid, at = int(sample.pid), int(sample.timeStamp) / 1e6
                busy[pid] = max(busy.get(pid, 0.0), at)
        return busy

    def snapshot(self, with_processes: bool = True) -> NvmlSnapshot:
        count = self.device_count()
        if isinstance(count, NA):
            return NvmlSnapshot([], unavailable=count.reason)
        return NvmlSnapshot(
            [self.gpu(i, with_processes) for i in range(int(count))],
            driver_version=self.driver_version(),
        )

    def close(self) -> None:
        self._call("nvmlShutdown")

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_nvml(lib: Any = None) -> Nvml | NA:
    """Initialise NVML; an NA saying why when that is impossible (no package, no driver)."""
    if lib is None:
        try:
            import pynvml as lib  # type: ignore[import-not-found,no-redef]
        except ImportError:
            return NA("nvidia-ml-py is not installed (pip install 'gpreempt[nvidia]')")
    try:
        lib.nvmlInit()
    except Exception as exc:
        return NA(_describe(lib, exc))
    return Nvml(lib)


def snapshot(lib: Any = None, with_processes: bool = True) -> NvmlSnapshot:
    """One look at every GPU; never raises for NVML's sake."""
    nv = open_nvml(lib)
    if isinstance(nv, NA):
        return NvmlSnapshot([], unavailable=nv.reason)
    with nv:
        return nv.snapshot(with_processes)


def process_name(pid: int) -> str | NA:
    """The process's command name from /proc, or NA if it exited or is hidden."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return NA("process exited")
    except OSError as exc:
        return NA(f"unreadable ({exc.strerror})")


def _text(x: Any) -> Any:
    return x.decode() if isinstance(x, bytes) else x


_REASONS = {
    "NVML_ERROR_NOT_SUPPORTED": "not supported on this GPU",
    "NVML_ERROR_NO_PERMISSION": "no permission",
    "NVML_ERROR_NOT_FOUND": "not found (process or sample gone)",
    "NVML_ERROR_GPU_IS_LOST": "GPU is lost",
    "NVML_ERROR_DRIVER_NOT_LOADED": "NVIDIA driver not loaded",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so not found (no NVIDIA driver installed)",
    "NVML_ERROR_FUNCTION_NOT_FOUND": "function not in this driver's NVML",
    "NVML_ERROR_UNINITIALIZED": "NVML not initialised",
    "NVML_ERROR_INVALID_ARGUMENT": "invalid argument",
}


def _describe(lib: Any, exc: Exception) -> str:
    """A short reason for an NVML error, using the library's error-code names."""
    code = getattr(exc, "value", None)
    if code is not None:
        for name, text in _REASONS.items():
            if getattr(lib, name, object()) == code:
                return text
    return str(exc) or type(exc).__name__
