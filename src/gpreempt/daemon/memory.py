"""Memory preemption: move a less important task's GPU memory to the host and back.

Eviction locks the task (no more CUDA calls, in-flight work drained), then checkpoints it:
the driver copies its device memory to host memory and frees it on the GPU. Restore does
the reverse, and only when the GPU has room for the whole footprint, since a restore that
runs out of memory can leave the process stuck. The process is never killed.

Two triggers: by hand (``gpreempt evict|restore``), and a task registered with
``--reserve-memory``: while it is active and the GPU's free memory is below its reserve,
less important tasks on that GPU are evicted (lowest priority first, then largest
footprint); they come back once no such task has been active for ``RESTORE_AFTER_S`` and
their footprint fits.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MechanismFailed, MechanismUnavailable, UsageError
from ..mechanisms import kind
from ..mechanisms import signal as signal_mechanism
from ..mechanisms.cuda_driver import CheckpointDriver, ProcessState
from ..mechanisms.driver_lock import DEFAULT_LOCK_TIMEOUT_MS
from .event_log import EventLog
from .registry import Registry, Task
from .task_state import StateLog

#: A task evicted for another's reserve comes back this long after the reserve is released.
RESTORE_AFTER_S = 2.0
#: A task whose eviction failed is not tried again for this long.
RETRY_AFTER_S = 10.0
#: Keep this fraction of host memory free when checkpointing into it.
HOST_HEADROOM = 0.10
#: Room to leave on the GPU beyond a restored footprint (allocator slack, contexts).
GPU_HEADROOM_BYTES = 256 << 20


@dataclass
class GpuMemory:
    free: int
    total: int


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


class MemoryManager:
    """Evicts and restores tasks' GPU memory for the daemon.

    It reads the tasks of ``registry``, writes what it does to ``events`` (and ``metrics``,
    if served), and calls ``on_change`` with ``"evict"`` once a task was evicted (what a
    successor daemon must resume changed) and with ``"restore"`` once one was restored (it is
    still locked: a scheduling pass lets it run if the policy allows).
    """

    def __init__(
        self,
        registry: Registry,
        events: EventLog,
        probe: MemoryProbe | None = None,
        driver: CheckpointDriver | None = None,
        *,
        lock_unavailable: str | None = None,
        lock_timeout_ms: int | None = None,
        metrics: Any = None,
        on_change: Callable[[str], None] = lambda event: None,
    ) -> None:
        self.registry = registry
        self.events = events
        self.probe = probe or MemoryProbe()
        self._driver = driver
        #: Why the driver's checkpoint API cannot be used here (None: it can).
        self.lock_unavailable = lock_unavailable
        self.lock_timeout_ms = lock_timeout_ms
        self.metrics = metrics
        self.on_change = on_change
        #: Tasks evicted to make room for a reserve (restored automatically), by task id.
        self.auto_evicted: set[int] = set()
        #: Tasks waiting for room on their GPU to be restored.
        self.pending_restore: set[int] = set()
        #: Last time a reserving task was active, per GPU.
        self.reserve_active_at: dict[int, float] = {}
        #: Tasks whose eviction failed, and until when not to try again.
        self.retry_after: dict[int, float] = {}
        self._busy = False

    @property
    def driver(self) -> CheckpointDriver:
        if self._driver is not None:
            return self._driver
        if self.lock_unavailable:
            raise MechanismUnavailable(
                "memory eviction needs the NVIDIA driver checkpoint API: " + self.lock_unavailable
            )
        return CheckpointDriver.get()

    # ------------------------------------------------------------------ operations
    def _states(self) -> StateLog:
        """How an eviction or a restore changes the task's state, and is told."""
        return StateLog(self.events, self.metrics)

    def evict(self, task: Task, reason: str) -> None:
        if task.evicted:
            raise UsageError(f"task {task.name!r} is already evicted")
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
        stopped = task.suspended and kind(task.suspended_with).stops_process
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
        seconds = time.perf_counter() - start
        task.evicted_bytes = footprint
        if not task.suspended:
            # Evicted while running: it stays locked after its restore until the policy lets
            # it run, like any task the lock mechanism suspended.
            task.preemptions += 1
        self._states().evicted(
            task, moved=footprint, seconds=seconds, reason=reason, now=time.monotonic()
        )
        # The lock taken here is not the policy's suspension: undo it right after restore.
        task.evict_unlock = not kind(task.suspended_with).holds_driver_lock
        self.on_change("evict")

    def restore(self, task: Task, reason: str) -> bool:
        """Restore now if the GPU has room; otherwise queue it and return False."""
        if not task.evicted:
            raise UsageError(f"task {task.name!r} is not evicted")
        memory = self.probe.gpu(task.gpu)
        if memory.free < task.evicted_bytes + GPU_HEADROOM_BYTES:
            self.pending_restore.add(task.task_id)
            return False
        driver = self.driver
        start = time.perf_counter()
        driver.restore(task.pid)
        seconds = time.perf_counter() - start
        state = driver.state(task.pid)
        if state == ProcessState.FAILED:
            self.events.write(
                "error",
                **task.event_fields(),
                mechanism="evict",
                reason="restore left the process FAILED; it may need a restart",
            )
            raise MechanismFailed(
                f"restoring {task.name!r} left it in the FAILED state; the process may need "
                "a restart"
            )
        if task.evict_unlock:
            driver.unlock(task.pid)
        self._states().restored(
            task, moved=task.evicted_bytes, seconds=seconds, reason=reason, now=time.monotonic()
        )
        self.pending_restore.discard(task.task_id)
        self.auto_evicted.discard(task.task_id)
        # Still locked: the daemon's next scheduling pass lets it run if the policy allows.
        self.on_change("restore")
        return True

    # ------------------------------------------------------------------ reserve trigger
    def enforce_reserves(self) -> None:
        """Evict for active reserving tasks; restore what is no longer needed."""
        if self._busy:
            return
        self._busy = True
        try:
            self._enforce_reserves()
        finally:
            self._busy = False

    def needed(self) -> bool:
        """Whether :meth:`enforce_reserves` has anything to look at."""
        return bool(self.auto_evicted or self.pending_restore) or any(
            t.reserve_bytes > 0 for t in self.registry.tasks.values()
        )

    def _enforce_reserves(self) -> None:
        tasks = list(self.registry.tasks.values())
        reservers = [t for t in tasks if t.reserve_bytes > 0 and t.active and not t.held]
        now = time.monotonic()
        for reserver in reservers:
            for gpu in reserver.gpus:
                self.reserve_active_at[gpu] = now
                self._make_room(reserver, gpu, tasks)
        for task_id in sorted(self.auto_evicted | self.pending_restore):
            task = self.registry.tasks.get(task_id)
            if task is None:
                self.auto_evicted.discard(task_id)
                self.pending_restore.discard(task_id)
                continue
            last = self.reserve_active_at.get(task.gpu, 0.0)
            if task_id in self.auto_evicted and now - last < RESTORE_AFTER_S:
                continue
            try:
                self.restore(task, reason="reserve released")
            except (MechanismFailed, MechanismUnavailable):
                self.auto_evicted.discard(task_id)
                self.pending_restore.discard(task_id)

    def _make_room(self, reserver: Task, gpu: int, tasks: list[Task]) -> None:
        try:
            memory = self.probe.gpu(gpu)
        except MechanismUnavailable:
            return
        if memory.free >= reserver.reserve_bytes:
            return
        now = time.monotonic()
        candidates = [
            t
            for t in tasks
            if gpu in t.gpus
            and t.priority < reserver.priority
            and not t.evicted
            and self.retry_after.get(t.task_id, 0.0) <= now
        ]
        footprints = {t.task_id: self.probe.footprint(gpu, t.pid) for t in candidates}
        candidates.sort(key=lambda t: (t.priority, -footprints[t.task_id]))
        free = memory.free
        for victim in candidates:
            if free >= reserver.reserve_bytes:
                break
            if footprints[victim.task_id] <= 0:
                continue
            try:
                self.evict(victim, reason=f"room for {reserver.name!r}'s reserve")
            except (MechanismFailed, MechanismUnavailable) as exc:
                self.retry_after[victim.task_id] = now + RETRY_AFTER_S
                self.events.write(
                    "error",
                    **{**victim.event_fields(), "gpu": gpu},
                    mechanism="evict",
                    reason=f"eviction for a reserve failed: {exc}",
                )
                continue
            self.auto_evicted.add(victim.task_id)
            free += footprints[victim.task_id]
