"""An exact, event-driven simulator for policies: what would each task get?

It runs the loop the daemon runs (:func:`~gpreempt.policy.loop.run_pass`, after every change
and at the Decision's ``wake_at``) and applies the decisions instantly, so each task's
``run_seconds`` grows while it is active and not suspended. Suspend and resume cost nothing here,
so the results are the shares a policy aims for, not measurements.

Example::

    from gpreempt.policy import get_policy
    from gpreempt.policy.simulate import SimTask, simulate

    result = simulate(
        get_policy("share"),
        [SimTask(1, priority=100), SimTask(2, priority=-100, min_share=0.2)],
        duration=10.0,
    )
    print(result.shares())  # about {1: 0.8, 2: 0.2}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .loop import LoopState, credit_run_time, run_pass
from .snapshot import Policy, Snapshot, TaskView

#: Calls at one instant after which the simulator decides the policy is stuck.
MAX_CALLS_PER_INSTANT = 100


@dataclass(frozen=True)
class SimTask:
    """A simulated task: its settings and when it wants the GPU."""

    task_id: int
    priority: int = 0
    gpus: tuple[int, ...] = (0,)
    #: (start, end) intervals of simulated time during which the task is active;
    #: None = active all the time.
    active: tuple[tuple[float, float], ...] | None = None
    held: bool = False
    timeslice_ms: float | None = None
    min_share: float | None = None

    def is_active(self, now: float) -> bool:
        if self.active is None:
            return True
        return any(start <= now < end for start, end in self.active)

    def changes(self) -> list[float]:
        """Times at which the task becomes active or idle."""
        if self.active is None:
            return []
        return sorted({t for interval in self.active for t in interval})


@dataclass
class SimResult:
    """What each task got over the simulated time."""

    duration: float
    #: Seconds each task ran (active and not suspended).
    run_seconds: dict[int, float]
    #: Times each task went from running to suspended.
    preemptions: dict[int, int]
    #: How many times the policy was asked.
    calls: int
    #: Every decision's (time, suspended task ids), in order.
    trace: list[tuple[float, frozenset[int]]] = field(default_factory=list)

    def shares(self) -> dict[int, float]:
        """Fraction of the simulated time each task ran."""
        return {k: v / self.duration for k, v in self.run_seconds.items()}


def simulate(
    policy: Policy, tasks: Sequence[SimTask], duration: float, start: float = 0.0
) -> SimResult:
    """Run ``policy`` over ``duration`` seconds of simulated time from ``start``.

    Raises RuntimeError if the policy asks to be woken in the past, or keeps asking to be
    woken at the same instant (the daemon would spin).
    """
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"task ids must be unique, got {ids}")
    end = start + duration
    changes = sorted({t for task in tasks for t in task.changes() if start < t < end})
    run = dict.fromkeys(ids, 0.0)
    preemptions = dict.fromkeys(ids, 0)
    suspended: frozenset[int] = frozenset()
    state = LoopState()
    trace: list[tuple[float, frozenset[int]]] = []
    calls = 0
    now = start
    calls_now = 0
    while True:
        step = run_pass(policy, state, _snapshot(tasks, now, suspended, run))
        calls += 1
        state = step.state
        run = step.run_seconds()
        for task_id in step.suspend:
            if task_id in state.active:
                preemptions[task_id] += 1
        suspended = (suspended | step.suspend) - step.resume  # applied at once, at no cost
        trace.append((now, suspended))
        wake_at = step.wake_at
        if wake_at is not None and wake_at < now:
            raise RuntimeError(f"policy asked to be woken at {wake_at}, before now ({now})")
        following = [t for t in changes if t > now] + [end]
        if wake_at is not None:
            following.append(wake_at)
        later = min(following)
        if later <= now:
            calls_now += 1
            if calls_now > MAX_CALLS_PER_INSTANT:
                raise RuntimeError(f"policy keeps asking to be woken at {now}")
        else:
            calls_now = 0
        now = later
        if now >= end or math.isclose(now, end, rel_tol=0.0, abs_tol=1e-12):
            break
    # the last stretch, up to the end, ran without a pass after it
    final = credit_run_time(state, _snapshot(tasks, now, suspended, run))
    run = {view.task_id: view.run_seconds for view in final.tasks}
    return SimResult(
        duration=duration, run_seconds=run, preemptions=preemptions, calls=calls, trace=trace
    )


def _snapshot(
    tasks: Sequence[SimTask], now: float, suspended: frozenset[int], run: dict[int, float]
) -> Snapshot:
    """The simulated tasks as the policy sees them at ``now``."""
    return Snapshot(
        now=now,
        tasks=tuple(
            TaskView(
                task_id=t.task_id,
                priority=t.priority,
                gpus=t.gpus,
                active=t.is_active(now),
                suspended=t.task_id in suspended,
                held=t.held,
                timeslice_ms=t.timeslice_ms,
                min_share=t.min_share,
                run_seconds=run[t.task_id],
            )
            for t in tasks
        ),
    )
