"""Who a task is: what it was registered with, fixed for as long as it lives."""

from __future__ import annotations

from dataclasses import dataclass

from ..messages import TaskFields
from ..procinfo import ProcessInfo


@dataclass(frozen=True)
class TaskIdentity:
    """A task's process, owner, name, and what it asked for (``gpreempt run`` / ``attach``
    options): built once, from the checked fields of its registration (messages.TaskFields,
    which parsed its priority and mechanism), and never changed."""

    task_id: int
    pid: int
    #: Process group to signal (set for tasks ``gpreempt run`` started in their own group).
    pgid: int | None
    start_time: int
    uid: int
    #: Unique among its owner's tasks.
    name: str
    #: Larger = more important (gpreempt.priority).
    priority: int
    #: The GPUs it registered on (its ranks may add others while they run: Task.gpus).
    gpus: tuple[int, ...]
    #: Mechanism asked for: auto, gate, lock, signal or kfd (a MechanismName).
    mechanism: str
    always_active: bool = False
    timeslice_ms: float | None = None
    min_share: float | None = None
    #: Bytes of free GPU memory this task needs while active (memory preemption).
    reserve_bytes: int = 0

    @classmethod
    def of(cls, task_id: int, info: ProcessInfo, name: str, fields: TaskFields) -> TaskIdentity:
        """The identity of process ``info`` registered as ``name`` with ``fields``. A process
        leading its own group (a shell job, a ``gpreempt run`` child) is preempted with its
        whole group, so helpers such as DataLoader workers stop too."""
        return cls(
            task_id=task_id,
            pid=info.pid,
            pgid=info.pgid if info.pgid == info.pid else None,
            start_time=info.start_time,
            uid=info.uid,
            name=name,
            priority=fields.priority,
            gpus=fields.gpus,
            mechanism=fields.mechanism,
            always_active=fields.always_active,
            timeslice_ms=fields.timeslice_ms,
            min_share=fields.min_share,
            reserve_bytes=fields.reserve_bytes,
        )
