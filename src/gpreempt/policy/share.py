"""Strict priority with a guaranteed minimum share for tasks that ask for one.

Every task runs under strict priority, exactly as with ``hpf``, except that a task started
with ``--min-share F`` gets at least the fraction F of GPU time over a sliding window of
WINDOW_S seconds while it is active. When such a task is held back by more important tasks
and its share over the last window is F or less, it gets a burst: for
``max(F * (1 + HEADROOM) * WINDOW_S, MIN_BURST_S)`` seconds it runs and the tasks that would
preempt it (the more important ones on its GPUs) are suspended. Then strict priority returns.

With an always-active ``high`` task and an always-active ``low --min-share 0.2`` task on one
GPU, the low task runs about 240 ms out of every second and the high task the rest.

The share is run time over wall-clock time: a task that was idle for most of the window has
a small share, so it gets its burst as soon as it becomes active and is held back. Run time
comes from the ``run_seconds`` of successive snapshots, kept in the policy's memory, and the
policy asks to be woken at the exact time a held-back task's share will drop to F.

A task that preempts no one is unaffected. Bursts on one GPU do not overlap: a task waits for
a running burst on any of its GPUs to end before its own begins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from ..errors import UsageError
from .snapshot import Decision, Snapshot, TaskView

#: Length of the sliding window over which a task's share is measured, in seconds.
WINDOW_S = 1.0
#: Shortest burst, in seconds: shorter ones would cost more in suspend/resume than they give.
MIN_BURST_S = 0.010
#: Bursts aim this fraction above the guaranteed share, so that what suspending and resuming
#: cost in practice (a resumed process is not at full speed at once) does not eat the floor.
HEADROOM = 0.20
#: Samples kept per task at most (a safety bound; collinear samples are merged anyway).
MAX_SAMPLES = 4096
#: Tolerance for comparing shares and times computed from floating-point sums.
_EPS = 1e-9

#: One (daemon time, run_seconds) observation of a task.
Sample = tuple[float, float]


def check_min_share(value: float | str) -> float:
    """Validate a ``--min-share`` value; raise UsageError saying what is accepted."""
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"--min-share must be a fraction such as 0.2, not {value!r}") from None
    if not 0.0 < share <= 1.0:
        raise UsageError(
            f"--min-share {value} is out of range: use a fraction greater than 0 and at most "
            f"1 (0.2 = at least 20% of GPU time over each {WINDOW_S:g} s window)"
        )
    return share


def burst_seconds(min_share: float) -> float:
    """How long a starved task runs once it is let through."""
    return max(min_share * (1 + HEADROOM) * WINDOW_S, MIN_BURST_S)


def _wanted_share(task: TaskView) -> float:
    """The task's usable ``min_share`` (0 when absent or invalid; capped at 1)."""
    share = task.min_share
    if share is None or not share > 0.0 or math.isnan(share):
        return 0.0
    return min(share, 1.0)


@dataclass(frozen=True)
class ShareMemory:
    """What the share policy remembers between calls."""

    #: Per task id: (time, run_seconds) samples, oldest first, covering the last window.
    samples: dict[int, tuple[Sample, ...]] = field(default_factory=dict)
    #: Per task id: daemon time at which its current burst ends.
    bursts: dict[int, float] = field(default_factory=dict)


def _run_at(samples: tuple[Sample, ...], when: float) -> float:
    """Run seconds at time ``when``, interpolated between samples (flat outside them).

    Between two calls nothing changes (the daemon asks after every change), so run time
    grows linearly between successive samples and the interpolation is exact.
    """
    if when <= samples[0][0]:
        return samples[0][1]
    for (t0, r0), (t1, r1) in pairwise(samples):
        if when <= t1:
            return r0 if t1 <= t0 else r0 + (r1 - r0) * (when - t0) / (t1 - t0)
    return samples[-1][1]


def _first_time_above(samples: tuple[Sample, ...], level: float) -> float:
    """The earliest time at which run seconds exceed ``level`` (-inf if always, inf if never).

    "Exceed" means by more than a rounding error, so that a share exactly at its minimum at
    the end of a burst does not start another burst straight away.
    """
    level += _EPS
    if samples[0][1] > level:
        return -math.inf
    for (t0, r0), (t1, r1) in pairwise(samples):
        if r1 > level:
            return t1 if r1 <= r0 else t0 + (level - r0) * (t1 - t0) / (r1 - r0)
    return math.inf


def share_in_window(samples: tuple[Sample, ...], now: float) -> float:
    """Fraction of the last WINDOW_S seconds (up to ``now``) during which the task ran."""
    return (samples[-1][1] - _run_at(samples, now - WINDOW_S)) / WINDOW_S


def starves_at(samples: tuple[Sample, ...], min_share: float) -> float:
    """When the task's share drops to ``min_share`` if it does not run from the last sample on.

    Its share at a later time t is (R_last - R(t - W)) / W; it reaches ``min_share`` once
    R(t - W) exceeds R_last - min_share * W. Returns -inf if that is already the case.
    """
    level = samples[-1][1] - min_share * WINDOW_S
    return _first_time_above(samples, level) + WINDOW_S


def _add_sample(old: tuple[Sample, ...], now: float, run: float) -> tuple[Sample, ...]:
    """``old`` plus (now, run), without samples the window no longer needs."""
    samples = list(old)
    if samples and now <= samples[-1][0]:
        samples[-1] = (samples[-1][0], max(run, samples[-1][1]))
    else:
        # Merge a middle sample that lies on the line through its neighbours.
        if len(samples) >= 2:
            (t0, r0), (t1, r1) = samples[-2], samples[-1]
            if abs((r1 - r0) * (now - t1) - (run - r1) * (t1 - t0)) <= _EPS * (now - t0):
                samples.pop()
        samples.append((now, run))
    # Keep one sample at or before the window's start, for interpolation there.
    start = now - WINDOW_S
    while len(samples) >= 2 and samples[1][0] <= start:
        samples.pop(0)
    if len(samples) > MAX_SAMPLES:
        samples = samples[-MAX_SAMPLES:]
    return tuple(samples)


def _runnable(task: TaskView) -> bool:
    return task.active and not task.held


def decide_share(snapshot: Snapshot, memory: Any = None) -> Decision:
    """Strict priority per GPU, with bursts for tasks below their ``--min-share``.

    ``memory`` is a ShareMemory; ``wake_at`` is the earliest of the end of a running burst
    and the time a held-back task's share will drop to its minimum.
    """
    previous = memory if isinstance(memory, ShareMemory) else ShareMemory()
    now = snapshot.now
    by_id = {t.task_id: t for t in snapshot.tasks}
    samples = {
        t.task_id: _add_sample(previous.samples.get(t.task_id, ()), now, t.run_seconds)
        for t in snapshot.tasks
        if _wanted_share(t) > 0.0
    }
    bursts = {
        task_id: until
        for task_id, until in previous.bursts.items()
        if until > now + _EPS and task_id in by_id and _runnable(by_id[task_id])
    }

    def held_back(task: TaskView) -> bool:
        """Whether a more important runnable task shares a GPU with ``task``."""
        return any(
            _runnable(o) and o.priority > task.priority and set(o.gpus) & set(task.gpus)
            for o in snapshot.tasks
        )

    def burst_gpus() -> set[int]:
        return {g for task_id in bursts for g in by_id[task_id].gpus}

    # Start bursts, most starved first (relative to what they asked for).
    candidates = []
    for task in snapshot.tasks:
        wanted = _wanted_share(task)
        if wanted == 0.0 or task.task_id in bursts or not _runnable(task):
            continue
        if not held_back(task):
            continue
        if starves_at(samples[task.task_id], wanted) <= now + _EPS:
            share = share_in_window(samples[task.task_id], now)
            candidates.append((share / wanted, -task.priority, task.task_id))
    for _, _, task_id in sorted(candidates):
        if burst_gpus().isdisjoint(by_id[task_id].gpus):
            bursts[task_id] = now + burst_seconds(_wanted_share(by_id[task_id]))

    # Strict priority, with tasks in a burst ranked above everyone on their GPUs.
    def rank(task: TaskView) -> tuple[int, int]:
        return (1 if task.task_id in bursts else 0, task.priority)

    suspend: set[int] = set()
    for tasks in snapshot.by_gpu().values():
        running = [rank(t) for t in tasks if _runnable(t)]
        if running:
            top = max(running)
            suspend.update(t.task_id for t in tasks if rank(t) < top)

    wakes = list(bursts.values())
    for task_id, task_samples in samples.items():
        task = by_id[task_id]
        if task_id in suspend and _runnable(task) and task_id not in bursts:
            when = starves_at(task_samples, _wanted_share(task))
            if math.isfinite(when) and when > now + _EPS:
                wakes.append(when)
    return Decision(
        suspend=frozenset(suspend),
        wake_at=min(wakes) if wakes else None,
        memory=ShareMemory(samples=samples, bursts=bursts),
    )
