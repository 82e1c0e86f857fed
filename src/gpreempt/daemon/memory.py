"""Memory preemption: move a less important task's GPU memory to the host and back.

Eviction locks the task (no more CUDA calls, in-flight work drained), then checkpoints it:
the driver copies its device memory to host memory and frees it on the GPU. Restore does
the reverse, and only when the GPU has room for the whole footprint, since a restore that
runs out of memory can leave the process stuck. The process is never killed.

Two triggers: by hand (``gpreempt evict|restore``), and a task registered with
``--reserve-memory``: while it is active and the GPU's free memory is below its reserve,
less important tasks on that GPU are evicted (memory_plan.py decides which, and when they
come back). This module reads the memory and makes the driver calls; the executor
(apply_memory.py) records what they did.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import MechanismFailed, MechanismUnavailable
from ..mechanisms import kind
from ..mechanisms import signal as signal_mechanism
from ..mechanisms.cuda_driver import CheckpointDriver, ProcessState
from ..mechanisms.driver_lock import DEFAULT_LOCK_TIMEOUT_MS
from .task import Task

#: Keep this fraction of host memory free when checkpointing into it.
HOST_HEADROOM = 0.10
#: Room to leave on the GPU beyond a restored footprint (allocator slack, contexts).
GPU_HEADROOM_BYTES = 256 << 20


@dataclass
class GpuMemory:
    free: int
    total: int


@dataclass(frozen=True)
class Moved:
    """What one eviction moved to the host: its bytes, and how long it took."""

    bytes: int
    seconds: float


class RestoreLeftFailed(MechanismFailed):
    """The driver restored a task's memory and left its process in the FAILED state."""


class MemoryProbe:
    """GPU and host memory readings; NVML through the project's one NVML module."""

    def __init__(self) -> None:
        self._nvml = None

    def _session(self):  # type: ignore[no-untyped-def]
        from ..nvml import NA, open_nvml

        if self._nvml is None:
            nv = open_nvml()
            if isinstance(nv, NA):
                raise MechanismUnavailable(f"cannot read GPU memory: {nv.reason}")
            self._nvml = nv
        return self._nvml

    def gpu(self, index: int) -> GpuMemory:
        info = self._session().gpu(index, with_processes=False)
        if not isinstance(info.memory_total, int) or not isinstance(info.memory_used, int):
            raise MechanismUnavailable(f"NVML does not report memory of GPU {index}")
        return GpuMemory(free=info.memory_total - info.memory_used, total=info.memory_total)

    def footprint(self, index: int, pid: int) -> int:
        """Device memory ``pid`` holds on GPU ``index`` (0 if NVML does not list it)."""
        nv = self._session()
        handle = nv._call("nvmlDeviceGetHandleByIndex", index)
        processes = nv.processes(handle)
        for process in processes if isinstance(processes, list) else []:
            if process.pid == pid and isinstance(process.used_memory, int):
                return process.used_memory
        return 0

    @staticmethod
    def host_available() -> int:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        return 0


def refuse_unsupported(task: Task) -> None:
    """Refuse, with the reason, processes the driver checkpoint API cannot handle."""
    if len(task.gpus) > 1:
        raise MechanismUnavailable(
            f"task {task.name!r} uses several GPUs; the driver checkpoint API does not support "
            "multi-GPU (NCCL) jobs"
        )
    try:
        maps = Path(f"/proc/{task.pid}/maps").read_text(errors="replace")
    except OSError:
        maps = ""
    # Every CUDA build of PyTorch maps libnccl; a job that *uses* NCCL between GPUs of one
    # node maps its shared-memory transport segments.
    if "/dev/shm/nccl-" in maps:
        raise MechanismUnavailable(
            f"task {task.name!r} runs NCCL communication; the driver checkpoint API does not "
            "support NCCL jobs"
        )
    try:
        environ = Path(f"/proc/{task.pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    if any(e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=") for e in environ) or _mps_server_runs():
        raise MechanismUnavailable(
            f"task {task.name!r} is (or may be) an MPS client, and the driver checkpoint API "
            "does not support MPS; stop the MPS control daemon to use eviction"
        )


def _mps_server_runs() -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith("nvidia-cuda-mps"):
                    return True
            except OSError:
                continue
    return False


class MemoryMover:
    """Moves one task's GPU memory to the host and back with the driver's checkpoint API,
    refusing, with the reason, what it cannot handle. ``lock_unavailable``: why this machine's
    driver has no checkpoint API (None: it has)."""

    def __init__(
        self,
        probe: MemoryProbe | None = None,
        driver: CheckpointDriver | None = None,
        *,
        lock_unavailable: str | None = None,
        lock_timeout_ms: int | None = None,
    ) -> None:
        self.probe = probe or MemoryProbe()
        self._driver = driver
        self.lock_unavailable = lock_unavailable
        self.lock_timeout_ms = lock_timeout_ms

    @property
    def driver(self) -> CheckpointDriver:
        if self._driver is not None:
            return self._driver
        if self.lock_unavailable:
            raise MechanismUnavailable(
                "memory eviction needs the NVIDIA driver checkpoint API: " + self.lock_unavailable
            )
        return CheckpointDriver.get()

    def evict(self, task: Task) -> Moved:
        """Lock ``task`` in the driver and checkpoint it (continued meanwhile if signals
        stopped it: the driver needs its threads). Raises MechanismUnavailable or
        MechanismFailed, saying why, where it cannot."""
        refuse_unsupported(task)
        driver = self.driver
        state = driver.state(task.pid)
        if state == ProcessState.FAILED:
            raise MechanismFailed(
                f"the driver reports task {task.name!r} (pid {task.pid}) in the FAILED state; "
                "it cannot be checkpointed. Check the process's own output; it may need a restart"
            )
        footprint = self.probe.footprint(task.gpu, task.pid)
        available = self.probe.host_available()
        if footprint > available * (1 - HOST_HEADROOM):
            raise MechanismFailed(
                f"not enough host memory to evict {task.name!r}: it holds "
                f"{footprint / 2**30:.1f} GiB on the GPU and {available / 2**30:.1f} GiB are "
                "available on the host"
            )
        stopped = task.suspended and (
            kind(task.suspended_with).stops_process or task.backstop_signalled
        )
        start = time.perf_counter()
        if stopped:  # the driver needs the process's threads to take the lock
            signal_mechanism.send(task.target(), signal.SIGCONT)
        try:
            if state == ProcessState.RUNNING:
                driver.lock(task.pid, self.lock_timeout_ms or DEFAULT_LOCK_TIMEOUT_MS)
            driver.checkpoint(task.pid)
        finally:
            if stopped:
                signal_mechanism.send(task.target(), signal.SIGSTOP)
        return Moved(bytes=footprint, seconds=time.perf_counter() - start)

    def has_room(self, gpu: int, size: int) -> bool:
        """Whether ``gpu`` has room for ``size`` bytes and the headroom a restore needs."""
        return self.probe.gpu(gpu).free >= size + GPU_HEADROOM_BYTES

    def restore(self, task: Task, *, unlock: bool) -> float:
        """Bring ``task``'s memory back, and unlock it (``unlock``: the eviction's lock was
        not how it is suspended); returns how long it took (s). Raises RestoreLeftFailed where
        the driver leaves the process FAILED."""
        driver = self.driver
        start = time.perf_counter()
        driver.restore(task.pid)
        seconds = time.perf_counter() - start
        if driver.state(task.pid) == ProcessState.FAILED:
            raise RestoreLeftFailed(
                f"restoring {task.name!r} left it in the FAILED state; the process may need "
                "a restart"
            )
        if unlock:
            driver.unlock(task.pid)
        return seconds
