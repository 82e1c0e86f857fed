"""What the driver-lock backstop does in a pass, as pure functions over frozen facts.

The rules are backstop.py's (its docstring says why): a task of mechanism ``auto`` held by its
gate for the delay is locked in the driver too, unless its gate holds it on the GPU and only
tasks of its own user outrank it there; the launches of a task whose gate holds it outright
must stand still once it has been held a moment, or its hold leaks (and it is locked at once).
:func:`plan_backstop` reads :class:`HoldFacts` and returns a frozen :class:`BackstopPlan`; the
executor (apply.py) carries it out, with backstop.py's lock calls. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: After this long held, a gated task's launches must stand still.
SETTLE_MS = 200.0
#: How often they are looked at, while it stays suspended.
CHECK_PERIOD_MS = 100.0
#: Launches a held process may still count per channel (a launch per thread it holds).
LEAK_SLACK = 16


@dataclass(frozen=True)
class HoldFacts:
    """What the backstop's rules read of one task."""

    task_id: int
    uid: int
    priority: int
    gpus: tuple[int, ...]
    #: Held by hand (``gpreempt suspend``): it outranks nobody meanwhile.
    held: bool
    #: Its mechanism is backed up by the driver lock (``auto``).
    backed_up: bool
    #: Since when its gate holds it for a more important task or by hand (daemon time);
    #: None while it is not held by its gate, or only waits for its turn among peers.
    gate_held_since: float | None
    #: Its gate holds on the GPU by itself (:attr:`~gpreempt.daemon.task.Task.held_on_gpu`).
    held_on_gpu: bool
    #: Locked behind its gate already, being locked, or its lock failed this suspension.
    lock_tried: bool
    #: Its driver-level gates are on and count its launches.
    counts_launches: bool
    #: The launches they counted, over its processes.
    launches: int
    #: Its processes with a channel (each may count a launch per thread it holds).
    channels: int
    #: One of its gate words is closed outright: its launches must stand still.
    must_stand_still: bool
    #: Its launches once its gate had held it a moment, this suspension (None: not yet).
    hold_baseline: int | None
    #: Its hold was found to leak, this suspension.
    hold_leaked: bool


@dataclass(frozen=True)
class HoldBaseline:
    """Count ``task_id``'s launches from ``launches`` on (its hold is checked from the next
    look)."""

    task_id: int
    launches: int


@dataclass(frozen=True)
class HoldLeak:
    """``task_id``'s work went on behind its closed gate: ``moved`` launches since its
    baseline; ``locked``: the driver lock backs it up (else this machine has none)."""

    task_id: int
    moved: int
    locked: bool


@dataclass(frozen=True)
class BackstopPlan:
    """What the backstop does in one pass, in this order."""

    baselines: tuple[HoldBaseline, ...]
    leaks: tuple[HoldLeak, ...]
    #: Tasks to lock in the driver behind their gate.
    locks: tuple[int, ...]


def plan_backstop(
    tasks: Sequence[HoldFacts], now: float, *, delay_s: float, lock: bool
) -> BackstopPlan:
    """Check the holds; lock every task held by its gate for ``delay_s`` or longer (at once
    for one whose hold leaks). ``lock``: whether the backstop may lock at all."""
    baselines: list[HoldBaseline] = []
    leaks: list[HoldLeak] = []
    for task in tasks:
        since = task.gate_held_since
        if not _checked(task) or since is None or now < since + SETTLE_MS / 1e3:
            continue
        if task.hold_baseline is None or not task.must_stand_still:
            baselines.append(HoldBaseline(task.task_id, task.launches))
            continue
        moved = task.launches - task.hold_baseline
        if moved > LEAK_SLACK * max(1, task.channels):
            leaks.append(HoldLeak(task.task_id, moved, locked=lock))
    leaked = {leak.task_id for leak in leaks}
    locks: list[int] = []
    if lock:
        for task in tasks:
            since = task.gate_held_since
            if since is None or not _eligible(task, tasks, leaked):
                continue
            if task.hold_leaked or task.task_id in leaked or now >= since + delay_s:
                locks.append(task.task_id)
    return BackstopPlan(baselines=tuple(baselines), leaks=tuple(leaks), locks=tuple(locks))


def next_due(tasks: Sequence[HoldFacts], now: float, *, delay_s: float, lock: bool) -> float | None:
    """Daemon time at which a task next needs its lock or a check of its hold, if any."""
    due = [
        max(t.gate_held_since + SETTLE_MS / 1e3, now + CHECK_PERIOD_MS / 1e3)
        if t.hold_baseline is not None
        else t.gate_held_since + SETTLE_MS / 1e3
        for t in tasks
        if _checked(t) and t.gate_held_since is not None
    ]
    if lock:
        due += [
            t.gate_held_since + delay_s
            for t in tasks
            if t.gate_held_since is not None and _eligible(t, tasks, set())
        ]
    return min(due) if due else None


def _checked(task: HoldFacts) -> bool:
    """Whether the task's hold is checked now: its gate holds it, and it has a driver-level
    gate that counts its launches."""
    return task.gate_held_since is not None and not task.hold_leaked and task.counts_launches


def _eligible(task: HoldFacts, tasks: Sequence[HoldFacts], leaked: set[int]) -> bool:
    """Whether the lock may back ``task``'s gate up (``leaked``: tasks found leaking now)."""
    held_on_gpu = task.held_on_gpu and task.task_id not in leaked
    return (
        task.backed_up
        and task.gate_held_since is not None
        and not (held_on_gpu and not _for_another_user(task, tasks))
        and not task.lock_tried
    )


def _for_another_user(task: HoldFacts, tasks: Sequence[HoldFacts]) -> bool:
    """Whether a more important task of another user shares a GPU with ``task``: its
    gate's own words (barriers on, driver-level gate on) then do not spare it the lock.
    What a client writes in its block may only hurt its own user: a task that claims a
    gate it does not have is locked like any other once the delay has passed."""
    return any(
        other.uid != task.uid
        and other.priority > task.priority
        and not other.held
        and set(other.gpus) & set(task.gpus)
        for other in tasks
    )
