"""What a policy sees and what it returns: frozen values, no I/O, no clocks of its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskView:
    """One task as the policy sees it at one instant."""

    #: Daemon-assigned id, unique for the daemon's lifetime.
    task_id: int
    #: Larger = more important; see gpreempt.priority.
    priority: int
    #: GPU indexes the task uses; tasks interact only when they share one.
    gpus: tuple[int, ...]
    #: The task wants the GPU now (open request(), GPU work in flight, or always-active).
    active: bool
    #: The task is suspended right now (by policy or by hand).
    suspended: bool = False
    #: An operator holds it suspended (``gpreempt suspend``); policies must not count it as
    #: running and the daemon keeps it suspended whatever the policy says.
    held: bool = False
    #: Time slice asked for with ``--timeslice-ms``, if any.
    timeslice_ms: float | None = None
    #: Guaranteed fraction of GPU time asked for with ``--min-share``, if any.
    min_share: float | None = None
    #: Seconds the task has been running (active and not suspended) since it registered.
    run_seconds: float = 0.0
    #: An in-process gate bounds what the task keeps queued (mechanism gate or auto).
    gated: bool = False
    #: Its gate puts stream barriers: the GPU holds what it queued at the next barrier, so a
    #: preemption waits for at most one barrier's spacing of its work.
    barriers: bool = False
    #: It says when it is active with ``request()``: its launches outside requests do not
    #: count, so nobody needs its gate to notice them.
    hinted: bool = False
    #: Seconds since the task last wanted the GPU (0 while it does; inf if it never did).
    idle_s: float = float("inf")
    #: The user it runs as: what one user's task says of itself (its gate words) is taken
    #: on trust only by that user's other tasks (turns among peers; 0 in one process).
    uid: int = 0


@dataclass(frozen=True)
class Snapshot:
    """Every task known to the daemon, at daemon time ``now`` (monotonic seconds)."""

    now: float
    tasks: tuple[TaskView, ...]

    def by_gpu(self) -> dict[int, list[TaskView]]:
        """Tasks grouped by GPU index (a task on two GPUs appears under both)."""
        groups: dict[int, list[TaskView]] = {}
        for task in self.tasks:
            for gpu in task.gpus:
                groups.setdefault(gpu, []).append(task)
        return groups


@dataclass(frozen=True)
class Decision:
    """A policy's answer: the tasks that should be suspended now.

    The daemon suspends the tasks in ``suspend`` that run and resumes the suspended tasks
    that are not in it (held tasks excepted).
    """

    #: Task ids that should be suspended; every other task may run.
    suspend: frozenset[int]
    #: Daemon time at which to ask the policy again even if nothing changes (time slices);
    #: None = only on the next change.
    wake_at: float | None = None
    #: Policy-private memory handed back on the next call (turns, usage windows).
    memory: Any = field(default=None, compare=False)
    #: The tasks in ``suspend`` only because a peer of equal priority has the turn.
    turns: frozenset[int] = frozenset()
    #: The tasks in ``suspend`` only because a more important task is active: they may run
    #: the moment none is (a gate that watches those tasks goes on by itself; policy/watch.py).
    until_idle: frozenset[int] = frozenset()


#: A policy: ``decide(snapshot, memory) -> Decision`` (policy/__init__.py).
Policy = Callable[[Snapshot, Any], Decision]
