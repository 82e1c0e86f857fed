"""The NVML chokepoint with a fake NVML: unsupported calls, vanished processes, no driver."""

from __future__ import annotations

import os
from types import SimpleNamespace

from gpreempt import nvml
from gpreempt.nvml import NA


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The subset of pynvml that gpreempt calls, with switches for failures."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_DRIVER_NOT_LOADED = 9

    def __init__(self, gpus=1, processes=(), init_error=None, unsupported=(), util_samples=()):
        self.gpus = gpus
        self.procs = list(processes)
        self.init_error = init_error
        self.unsupported = set(unsupported)
        self.util_samples = list(util_samples)
        self.shutdown = False

    def _check(self, name):
        if name in self.unsupported:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self):
        return "580.159"

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h[1]}"

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check("util")
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=30 << 30, total=141 << 30, free=111 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._check("procs")
        return self.procs

    def nvmlDeviceGetProcessUtilization(self, h, since):
        self._check("putil")
        if not self.util_samples:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return self.util_samples


def test_snapshot_happy_path():
    me = os.getpid()
    fake = FakeNvml(
        gpus=2,
        processes=[SimpleNamespace(pid=me, usedGpuMemory=2 << 30)],
        util_samples=[SimpleNamespace(pid=me, smUtil=55), SimpleNamespace(pid=me, smUtil=60)],
    )
    snap = nvml.snapshot(fake)
    assert snap.unavailable is None and len(snap.gpus) == 2
    g = snap.gpus[0]
    assert (g.name, g.util_gpu, g.memory_used) == ("NVIDIA H200", 87, 30 << 30)
    (p,) = g.processes
    assert (p.pid, p.used_memory, p.sm_util) == (me, 2 << 30, 60)
    assert p.name  # this test's own process name
    assert fake.shutdown
    d = snap.to_dict()
    assert d["gpus"][0]["processes"][0]["sm_util"] == 60
    assert d["driver_version"] == "580.159"


def test_unsupported_queries_become_na():
    fake = FakeNvml(unsupported={"util", "procs"})
    g = nvml.snapshot(fake).gpus[0]
    assert isinstance(g.util_gpu, NA) and g.util_gpu.reason == "not supported on this GPU"
    assert isinstance(g.processes, NA)
    d = g.to_dict()
    assert d["util_gpu"] is None and d["processes"] is None
    assert d["processes_na"] == "not supported on this GPU"
    assert g.memory_total == 141 << 30


def test_vanished_process_and_missing_samples():
    fake = FakeNvml(processes=[SimpleNamespace(pid=2**22 + 12345, usedGpuMemory=None)])
    (p,) = nvml.snapshot(fake).gpus[0].processes
    assert isinstance(p.name, NA) and p.name.reason == "process exited"
    assert isinstance(p.used_memory, NA)
    assert isinstance(p.sm_util, NA) and "not found" in p.sm_util.reason
    assert p.to_dict() == {
        "pid": 2**22 + 12345,
        "name": None,
        "used_memory": None,
        "sm_util": None,
        "kind": "compute",
    }


def test_no_driver():
    snap = nvml.snapshot(FakeNvml(init_error=FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert snap.gpus == []
    assert "no NVIDIA driver" in snap.unavailable
    assert snap.to_dict()["available"] is False


class OldFakeNvml(FakeNvml):
    """Bindings that predate nvmlDeviceGetProcessUtilization."""

    nvmlDeviceGetProcessUtilization = None


def test_missing_function_in_old_bindings():
    fake = OldFakeNvml(processes=[SimpleNamespace(pid=os.getpid(), usedGpuMemory=1)])
    (p,) = nvml.snapshot(fake).gpus[0].processes
    assert isinstance(p.sm_util, NA) and "not in this nvidia-ml-py" in p.sm_util.reason


def test_na_is_falsy_and_prints_na():
    na = NA("x")
    assert not na and str(na) == "n/a" and nvml.value(na) is None and nvml.na_reason(na) == "x"
