"""The end of tasks, and what outlives the daemon: liveness, persistence, re-attachment.

A task ends when its process exits, its launcher disconnects, or it is detached: it is
resumed first, whatever its state. What a successor daemon must know (the processes this one
suspended, the tasks registered with ``attach``) is written whenever it changes
(persist.py), and a new daemon registers the attached tasks again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from ..errors import GpreemptError
from ..messages import TaskFields
from ..procinfo import ProcessInfo, alive, open_verified
from . import persist
from .apply import Executor
from .apply_memory import MemoryExecutor
from .event_log import EventLog
from .persist import StateFiles
from .registration import Registrar
from .registry import Registry
from .task import Task


class TaskLifecycle:
    """Ends tasks, checks that their processes live, and keeps the state files current."""

    def __init__(
        self,
        registry: Registry,
        registrar: Registrar,
        executor: Executor,
        events: EventLog,
        memory: MemoryExecutor,
        state_files: StateFiles,
        metrics: Any,
        reconcile: Callable[[], None],
        log: Callable[[str], None],
    ) -> None:
        self.registry = registry
        self.registrar = registrar
        self.executor = executor
        self.events = events
        self.memory = memory
        self.state_files = state_files
        self.metrics = metrics
        self.reconcile = reconcile
        self.log = log

    def end_task(self, task: Task, reason: str) -> None:
        """Resume ``task`` if it is suspended and forget it."""
        task.held = False
        if task.suspended:
            self.executor.resume(task, reason=f"task ended: {reason}")
        self.registry.remove(task.task_id)
        self.events.write("exit", **task.event_fields(), reason=reason)
        if self.metrics is not None:
            left = [(gpu, t.name) for t in self.registry.tasks.values() for gpu in t.gpus]
            for gpu in task.gpus:
                self.metrics.on_task_end(gpu, task.name, left)
        if task.attached:
            self.persist_attached()

    def check_liveness(self) -> None:
        """End the tasks whose processes exited; evict and restore for memory reserves."""
        if self.memory.needed():
            self.memory.enforce_reserves()
        changed = False
        for task in list(self.registry.tasks.values()):
            if not alive(task.pid, task.identity.start_time):
                self.end_task(task, "process exited")
                changed = True
        if changed:
            self.reconcile()
        self.publish_states()

    def resume_all(self, reason: str) -> None:
        """Resume every task (restoring the evicted ones first where there is room), each
        step guarded: whatever fails for one task, the others are resumed."""
        for task in list(self.registry.tasks.values()):
            task.held = False
            try:
                if task.evicted:
                    try:
                        restored = self.memory.restore(task, reason=reason)
                    except GpreemptError:
                        restored = False
                    if not restored:
                        self.log(
                            f"{task.name} stays evicted (no room to restore it); restore it "
                            "with `gpreempt restore` under a new daemon"
                        )
                        continue
                if task.suspended:
                    self.executor.resume(task, reason=reason)
            except Exception as exc:
                self.log(f"error resuming {task.name} on shutdown: {exc!r}")

    def persist(self) -> None:
        """Record which processes a successor must resume (persist.py)."""
        self.state_files.save_suspended(self.registry.tasks.values())

    def persist_attached(self) -> None:
        """Record the tasks registered with ``attach`` (persist.py)."""
        self.state_files.save_attached(self.registry.tasks.values())

    def reattach(self) -> None:
        """Register again the tasks a previous daemon had from ``attach``: each only if its
        pid still names the same process (start time) of the same user. One found stopped is
        continued first: this daemon stopped nothing yet, and the one that did is gone (its
        policy stops it again if it must)."""
        for record in persist.load_attached(self.state_files.attached_path):
            try:
                info = self.registrar.registrable(None, record.pid)
                if info.start_time != record.start_time or info.uid != record.uid:
                    continue
                self._continue_if_stopped(info)
                if self.registry.by_pid(record.pid) is not None:
                    continue
                # the limits of this daemon, which may be stricter than its predecessor's
                priority, min_share, timeslice_ms = self.registrar.limits.clamp(
                    record.uid, record.priority, record.min_share, record.timeslice_ms
                )
                fields = {
                    "name": record.name,
                    "priority": priority,
                    "gpus": record.gpus,
                    "mechanism": record.mechanism,
                    "always_active": record.always_active,
                    "timeslice_ms": timeslice_ms,
                    "min_share": min_share,
                    "reserve_bytes": record.reserve_bytes,
                }
                task = self.registrar.new_task(None, info, TaskFields.from_wire(fields))
            except (GpreemptError, ValueError, TypeError) as exc:
                self.log(f"not registering attached process {record.pid} again: {exc}")
                continue
            task.attached = True
            self.registry.add_pidfd(task)
            self.registry.add(task)
            self.events.write(
                "registered",
                **task.event_fields(),
                mechanism=task.mechanism,
                priority=task.priority,
                reason="attached under a previous daemon",
            )
        self.persist_attached()

    def _continue_if_stopped(self, info: ProcessInfo) -> None:
        """SIGCONT ``info``'s process (its group if it leads one) if it is stopped."""
        if info.state != "T":
            return
        try:
            pidfd = open_verified(info.pid, info.start_time)
        except GpreemptError:
            return
        try:
            if info.pgid == info.pid:
                os.killpg(info.pgid, signal.SIGCONT)
            else:
                signal.pidfd_send_signal(pidfd, signal.SIGCONT)
        except OSError as exc:
            self.log(f"cannot continue stopped process {info.pid}: {exc.strerror or exc}")
            return
        finally:
            os.close(pidfd)
        self.events.write(
            "resume", pid=info.pid, reason="found stopped when registered again after a restart"
        )

    def publish_states(self) -> None:
        """Hand every task's state to the metrics, if they are served."""
        if self.metrics is None:
            return
        from .prometheus import TaskSample

        self.metrics.publish(
            [
                TaskSample(
                    gpu=gpu,
                    task=task.name,
                    state=task.status_word,
                    suspended_seconds=task.counters.suspended_seconds,
                    suspended_since=task.suspended_since if task.suspended else None,
                )
                for task in self.registry.tasks.values()
                for gpu in task.gpus
            ]
        )
