"""Which tasks' GPU memory to move for the memory reserves, as pure functions over facts.

A task registered with ``--reserve-memory`` that is active (and not held) wants that much free
memory on each of its GPUs. Where there is less, the less important tasks there are evicted,
lowest priority first, then largest footprint, until the reserve fits; a task whose eviction
failed is left alone for :data:`RETRY_AFTER_S`. A task evicted for a reserve comes back once no
reserve of its GPU has been active for :data:`RESTORE_AFTER_S`; one waiting for room is tried
again at each pass. The readings (free memory, footprints) come in as values; the executor
(apply_memory.py) carries the steps out with memory.py's driver calls. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: A task evicted for another's reserve comes back this long after the reserve is released.
RESTORE_AFTER_S = 2.0
#: A task whose eviction failed is not tried again for this long.
RETRY_AFTER_S = 10.0


@dataclass(frozen=True)
class MemoryFacts:
    """What the reserve rules read of one task."""

    task_id: int
    name: str
    priority: int
    gpus: tuple[int, ...]
    #: Bytes of free GPU memory it needs while active (0: no reserve).
    reserve_bytes: int
    #: It wants the GPU now.
    active: bool
    #: Held by hand (``gpreempt suspend``): its reserve does not count meanwhile.
    held: bool
    #: Its memory is on the host already.
    evicted: bool


@dataclass(frozen=True)
class Victim:
    """A task to evict for a reserve, and the bytes its eviction frees."""

    task_id: int
    footprint: int


@dataclass(frozen=True)
class MakeRoom:
    """Evict ``victims`` in this order until ``free`` plus what they freed reaches ``need`` on
    ``gpu`` (one whose eviction fails is skipped), for the reserve of task ``reserver``."""

    reserver: str
    gpu: int
    need: int
    free: int
    victims: tuple[Victim, ...]


@dataclass(frozen=True)
class Waiting:
    """A task whose memory is on the host and which waits to come back."""

    task_id: int
    #: Its GPU; None: the task is gone.
    gpu: int | None
    #: Evicted for a reserve (not by hand): it waits for that reserve to be released.
    for_reserve: bool


@dataclass(frozen=True)
class RestorePlan:
    """The restores to try now, and the tasks to stop waiting for (gone)."""

    restore: tuple[int, ...]
    forget: tuple[int, ...]


def reservers(tasks: Sequence[MemoryFacts]) -> tuple[MemoryFacts, ...]:
    """The tasks whose reserve counts now: active, not held, with a reserve."""
    return tuple(t for t in tasks if t.reserve_bytes > 0 and t.active and not t.held)


def candidates(
    reserver: MemoryFacts,
    gpu: int,
    free: int,
    tasks: Sequence[MemoryFacts],
    retry_after: Mapping[int, float],
    now: float,
) -> tuple[MemoryFacts, ...]:
    """The tasks that may be evicted for ``reserver``'s reserve on ``gpu``, which has ``free``
    bytes: none where it fits; else the less important tasks there, resident, not refused
    lately (``retry_after``: until when each failed one is left alone)."""
    if free >= reserver.reserve_bytes:
        return ()
    return tuple(
        t
        for t in tasks
        if gpu in t.gpus
        and t.priority < reserver.priority
        and not t.evicted
        and retry_after.get(t.task_id, 0.0) <= now
    )


def plan_room(
    reserver: MemoryFacts,
    gpu: int,
    free: int,
    found: Sequence[MemoryFacts],
    footprints: Mapping[int, int],
) -> MakeRoom | None:
    """How to make room for ``reserver`` on ``gpu`` among the candidates ``found`` (their
    ``footprints`` there, by task id): lowest priority first, then largest footprint; those
    holding nothing there are no help. None where the reserve fits."""
    if free >= reserver.reserve_bytes:
        return None
    ordered = sorted(found, key=lambda t: (t.priority, -footprints[t.task_id]))
    return MakeRoom(
        reserver=reserver.name,
        gpu=gpu,
        need=reserver.reserve_bytes,
        free=free,
        victims=tuple(
            Victim(t.task_id, footprints[t.task_id]) for t in ordered if footprints[t.task_id] > 0
        ),
    )


def plan_restores(
    waiting: Sequence[Waiting], reserve_active_at: Mapping[int, float], now: float
) -> RestorePlan:
    """Which waiting tasks to restore now (by task id): each one evicted by hand, and each one
    evicted for a reserve of its GPU that has not been active for :data:`RESTORE_AFTER_S`
    (``reserve_active_at``: when each GPU's last was)."""
    restore: list[int] = []
    forget: list[int] = []
    for task in sorted(waiting, key=lambda t: t.task_id):
        if task.gpu is None:
            forget.append(task.task_id)
        elif not task.for_reserve or now - reserve_active_at.get(task.gpu, 0.0) >= RESTORE_AFTER_S:
            restore.append(task.task_id)
    return RestorePlan(restore=tuple(restore), forget=tuple(forget))
