"""What the daemon counted of a task since it registered (``status``, the metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TaskCounters:
    """A task's counters. Written by the executor alone (apply.py, apply_memory.py), as it
    carries out what was decided; read by anyone."""

    #: Suspensions for a more important task or a hold (not for a turn).
    preemptions: int = 0
    #: Times it was stopped to wait for its turn among peers (not counted in ``preemptions``).
    turns: int = 0
    #: Suspensions its mechanism held only in part, another one holding it (event ``degraded``).
    degradations: int = 0
    #: Time it spent suspended, its current suspension left out (s).
    suspended_seconds: float = 0.0
    #: How long its last suspension took to take hold (ms).
    last_suspend_ms: float | None = None
    #: GPU time the scheduling loop credited it with (policy/loop.py), as the policies read it.
    run_seconds: float = 0.0
    #: Suspensions whose hold was found to leak (backstop_plan.py).
    hold_leaks: int = 0
    #: Bytes its last eviction moved to the host.
    evicted_bytes: int = 0
