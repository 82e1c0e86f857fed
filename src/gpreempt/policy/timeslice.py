"""Time slices: tasks that want the same GPU at the same time take turns.

On each GPU, the tasks that are active (and not held) form a rotation. The task whose turn
it is runs alone for its slice while the others are suspended; when the slice ends, the next
task in the rotation gets the GPU. A lone active task runs with nobody suspended, and a task
that is not active is never suspended.

Rotation order is fixed: priority descending, then task id. A task that becomes active takes
its place in that order; a task whose turn it is and that goes idle (or is held) ends its turn
at once, and the turn passes to the next task in the order.

A task on several GPUs takes turns on each of them separately and is suspended while any of
its GPUs gives the turn to another task. That is simple and never lets a task run while it
should not, but such a task runs only when its turns line up, so it may get less than its
slices suggest; give multi-GPU jobs a GPU set of their own, or use ``hpf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .snapshot import Decision, Snapshot, TaskView

#: Default slice of a task with priority >= HIGH_PRIORITY_FLOOR (``high`` is 100).
HIGH_SLICE_MS = 80.0
#: Default slice of a task with priority <= LOW_PRIORITY_CEILING (``low`` is -100).
LOW_SLICE_MS = 20.0
#: Default slice of every other task (``normal`` and integers in between).
NORMAL_SLICE_MS = 50.0
HIGH_PRIORITY_FLOOR = 100
LOW_PRIORITY_CEILING = -100
#: Shortest slice accepted from ``--timeslice-ms``: below this, suspend/resume costs dominate.
MIN_SLICE_MS = 1.0


def default_slice_ms(priority: int) -> float:
    """The slice a task gets when it did not ask for one: longer for more important tasks."""
    if priority >= HIGH_PRIORITY_FLOOR:
        return HIGH_SLICE_MS
    if priority <= LOW_PRIORITY_CEILING:
        return LOW_SLICE_MS
    return NORMAL_SLICE_MS


def slice_seconds(task: TaskView) -> float:
    """The task's slice in seconds: its ``--timeslice-ms`` (at least MIN_SLICE_MS) if it
    asked for a positive one, else the default for its priority."""
    ms = task.timeslice_ms
    if ms is None or not ms > 0.0 or math.isinf(ms):  # ``not ms > 0`` also catches NaN
        return default_slice_ms(task.priority) / 1000.0
    return max(ms, MIN_SLICE_MS) / 1000.0


def check_timeslice_ms(value: float | str) -> float:
    """Validate a ``--timeslice-ms`` value; raise UsageError saying what is accepted."""
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise UsageError(
            f"--timeslice-ms must be a number of milliseconds, not {value!r}"
        ) from None
    if not MIN_SLICE_MS <= ms < float("inf"):
        raise UsageError(
            f"--timeslice-ms {value} is out of range: use at least {MIN_SLICE_MS:g} ms "
            f"(defaults: {HIGH_SLICE_MS:g} for high, {NORMAL_SLICE_MS:g} for normal, "
            f"{LOW_SLICE_MS:g} for low)"
        )
    return ms


@dataclass(frozen=True)
class Turn:
    """Whose turn it is on one GPU, and until when (daemon time)."""

    task_id: int
    priority: int
    until: float

    @property
    def order_key(self) -> tuple[int, int]:
        return _order_key_of(self.priority, self.task_id)


def _order_key_of(priority: int, task_id: int) -> tuple[int, int]:
    return (-priority, task_id)


def _order_key(task: TaskView) -> tuple[int, int]:
    return _order_key_of(task.priority, task.task_id)


def _next_turn(contenders: list[TaskView], previous: Turn | None, now: float) -> Turn:
    """The turn after ``previous`` in rotation order (the first task if there was none).

    A turn that follows one that ran out starts where that one ended, not when the daemon
    got round to it: a switch late by L would otherwise lengthen every slice by L, which moves
    the shares towards the shorter slices (400 and 100 ms would give 3.4 to 1 with every
    switch 25 ms late). It starts now where the previous one ended early (its task went
    idle) or so long ago that the new slice would be mostly gone."""
    chosen = contenders[0]
    if previous is not None:
        later = [t for t in contenders if _order_key(t) > previous.order_key]
        if later:
            chosen = later[0]
    length = slice_seconds(chosen)
    start = now
    if previous is not None and previous.until <= now < previous.until + length / 2:
        start = previous.until
    return Turn(chosen.task_id, chosen.priority, start + length)


def decide_timeslice(snapshot: Snapshot, memory: Any = None) -> Decision:
    """Give each GPU to one active task at a time, in turns of each task's slice.

    ``memory`` maps GPU index to the current Turn; ``wake_at`` is the earliest end of a
    turn on a GPU where others are waiting.
    """
    turns: dict[int, Turn] = dict(memory) if isinstance(memory, dict) else {}
    new_turns: dict[int, Turn] = {}
    suspend: set[int] = set()
    wake_at: float | None = None
    for gpu, tasks in sorted(snapshot.by_gpu().items()):
        contenders = sorted((t for t in tasks if t.active and not t.held), key=_order_key)
        if not contenders:
            continue
        turn = turns.get(gpu)
        ids = {t.task_id for t in contenders}
        if len(contenders) == 1:
            # Alone: run freely. Remember when its turn began, so that a task that joins
            # within the slice waits for the slice to end rather than cutting it short.
            only = contenders[0]
            if turn is None or turn.task_id != only.task_id:
                turn = Turn(only.task_id, only.priority, snapshot.now + slice_seconds(only))
            new_turns[gpu] = turn
            continue
        if turn is None or turn.task_id not in ids or snapshot.now >= turn.until:
            turn = _next_turn(contenders, turn, snapshot.now)
        new_turns[gpu] = turn
        suspend.update(i for i in ids if i != turn.task_id)
        wake_at = turn.until if wake_at is None else min(wake_at, turn.until)
    return Decision(suspend=frozenset(suspend), wake_at=wake_at, memory=new_turns)
