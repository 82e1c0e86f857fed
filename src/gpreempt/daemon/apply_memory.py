"""Carry out evictions and restores: by hand (``gpreempt evict|restore``), and those the
memory reserves need (memory_plan.py decides which).

The executor's memory side: it moves a task's memory with memory.py's driver calls and
records what they did (the task's state through task_state.StateLog, its counters, the event
log), and it keeps what the reserve rules read at the next pass: which tasks were evicted for
a reserve, which wait for room, when each GPU's reserve was last active, whose eviction failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import MechanismFailed, MechanismUnavailable, UsageError
from ..mechanisms import kind
from . import memory_plan
from .event_log import EventLog
from .memory import MemoryMover, RestoreLeftFailed
from .memory_plan import MakeRoom, MemoryFacts, Waiting
from .registry import Registry
from .task import Task
from .task_state import StateLog


class MemoryExecutor:
    """Evicts and restores tasks' GPU memory for the daemon.

    It reads the tasks of ``registry``, moves their memory with ``mover``, writes what it did
    to ``events`` (and ``metrics``, if served), and calls ``on_change`` with ``"evict"`` once a
    task was evicted (what a successor daemon must resume changed) and with ``"restore"`` once
    one was restored (it is still locked: a scheduling pass lets it run if the policy allows).
    """

    def __init__(
        self,
        registry: Registry,
        events: EventLog,
        mover: MemoryMover,
        *,
        metrics: Any = None,
        on_change: Callable[[str], None] = lambda event: None,
    ) -> None:
        self.registry = registry
        self.events = events
        self.mover = mover
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

    def _states(self) -> StateLog:
        """How an eviction or a restore changes the task's state, and is told."""
        return StateLog(self.events, self.metrics)

    # ------------------------------------------------------------------ one task
    def evict(self, task: Task, reason: str) -> None:
        """Move ``task``'s memory to the host; it stays locked until restored."""
        if task.evicted:
            raise UsageError(f"task {task.name!r} is already evicted")
        moved = self.mover.evict(task)
        task.counters.evicted_bytes = moved.bytes
        if not task.suspended:
            # Evicted while running: it stays locked after its restore until the policy lets
            # it run, like any task the lock mechanism suspended.
            task.counters.preemptions += 1
        self._states().evicted(
            task, moved=moved.bytes, seconds=moved.seconds, reason=reason, now=time.monotonic()
        )
        # The lock taken here is not the policy's suspension: undo it right after restore.
        task.evict_unlock = not kind(task.suspended_with).holds_driver_lock
        self.on_change("evict")

    def restore(self, task: Task, reason: str) -> bool:
        """Restore now if the GPU has room; otherwise queue it and return False."""
        if not task.evicted:
            raise UsageError(f"task {task.name!r} is not evicted")
        if not self.mover.has_room(task.gpu, task.counters.evicted_bytes):
            self.pending_restore.add(task.task_id)
            return False
        try:
            seconds = self.mover.restore(task, unlock=task.evict_unlock)
        except RestoreLeftFailed:
            self.events.write(
                "error",
                **task.event_fields(),
                mechanism="evict",
                reason="restore left the process FAILED; it may need a restart",
            )
            raise
        self._states().restored(
            task,
            moved=task.counters.evicted_bytes,
            seconds=seconds,
            reason=reason,
            now=time.monotonic(),
        )
        self.pending_restore.discard(task.task_id)
        self.auto_evicted.discard(task.task_id)
        # Still locked: the daemon's next scheduling pass lets it run if the policy allows.
        self.on_change("restore")
        return True

    # ------------------------------------------------------------------ reserves
    def needed(self) -> bool:
        """Whether :meth:`enforce_reserves` has anything to look at."""
        return bool(self.auto_evicted or self.pending_restore) or any(
            t.identity.reserve_bytes > 0 for t in self.registry.tasks.values()
        )

    def enforce_reserves(self) -> None:
        """Evict for active reserving tasks; restore what is no longer needed."""
        if self._busy:
            return
        self._busy = True
        try:
            self._enforce_reserves()
        finally:
            self._busy = False

    def _enforce_reserves(self) -> None:
        now = time.monotonic()
        for reserver in memory_plan.reservers(self.facts()):
            for gpu in reserver.gpus:
                self.reserve_active_at[gpu] = now
                looked_at = time.monotonic()
                step = self._plan_room(reserver, gpu, looked_at)
                if step is not None:
                    self._make_room(step, looked_at)
        tasks = self.registry.tasks
        waiting = []
        for task_id in self.auto_evicted | self.pending_restore:
            task = tasks.get(task_id)
            gpu = task.gpu if task is not None else None
            waiting.append(Waiting(task_id, gpu, for_reserve=task_id in self.auto_evicted))
        restores = memory_plan.plan_restores(waiting, self.reserve_active_at, now)
        for task_id in restores.forget:
            self.auto_evicted.discard(task_id)
            self.pending_restore.discard(task_id)
        for task_id in restores.restore:
            try:
                self.restore(tasks[task_id], reason="reserve released")
            except (MechanismFailed, MechanismUnavailable):
                self.auto_evicted.discard(task_id)
                self.pending_restore.discard(task_id)

    def facts(self) -> tuple[MemoryFacts, ...]:
        """Every task as the reserve rules read it, now."""
        return tuple(
            MemoryFacts(
                task_id=t.task_id,
                name=t.name,
                priority=t.priority,
                gpus=t.gpus,
                reserve_bytes=t.identity.reserve_bytes,
                active=t.active,
                held=t.held,
                evicted=t.evicted,
            )
            for t in self.registry.tasks.values()
        )

    def _plan_room(self, reserver: MemoryFacts, gpu: int, now: float) -> MakeRoom | None:
        """Read ``gpu``'s memory and the candidates' footprints there, and ask the rules."""
        probe = self.mover.probe
        try:
            free = probe.gpu(gpu).free
        except MechanismUnavailable:
            return None
        tasks = self.registry.tasks
        found = memory_plan.candidates(reserver, gpu, free, self.facts(), self.retry_after, now)
        footprints = {t.task_id: probe.footprint(gpu, tasks[t.task_id].pid) for t in found}
        return memory_plan.plan_room(reserver, gpu, free, found, footprints)

    def _make_room(self, step: MakeRoom, now: float) -> None:
        """Evict the step's victims in turn until its reserve fits (``now``: from when a
        failed one is left alone)."""
        free = step.free
        for victim in step.victims:
            if free >= step.need:
                break
            task = self.registry.tasks[victim.task_id]
            try:
                self.evict(task, reason=f"room for {step.reserver!r}'s reserve")
            except (MechanismFailed, MechanismUnavailable) as exc:
                self.retry_after[victim.task_id] = now + memory_plan.RETRY_AFTER_S
                self.events.write(
                    "error",
                    **{**task.event_fields(), "gpu": step.gpu},
                    mechanism="evict",
                    reason=f"eviction for a reserve failed: {exc}",
                )
                continue
            self.auto_evicted.add(victim.task_id)
            free += victim.footprint
