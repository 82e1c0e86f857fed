"""Which gates may sleep: disable their per-operator hook while nothing can preempt them.

A gate's operator hook costs a CPU-bound trainer several percent of its speed even when it
lets every operator through. Under strict priority a task needs it only while a more important
task on its GPU may start: so once every such task has been idle for ``after_s``, the daemon
lets the task's gate sleep (``sleep_ok`` in its control block), and the gate wakes by itself
the moment the daemon closes it or a watched task becomes active (docs/gate.md).

A task whose own activity somebody needs never sleeps: one with a less important task on its
GPU that does not call ``request()`` (its gate notices its launches, and that preempts the
less important one), or one that takes turns with gated peers of equal priority (a turn passes
on when its holder goes idle). A server that calls ``request()`` says when it is active by
itself, so its gate may sleep too: an eager server then pays no per-operator hook on each of
its hundreds of operators per request.
"""

from __future__ import annotations

from .snapshot import Snapshot

#: How long every more important task must have been idle before a gate may sleep (s). An
#: asleep gate with stream barriers still holds its queue (its sleep thread puts them, and it
#: wakes if its process queues more than its GPU runs), so the pause only has to outlast the
#: gaps between the requests of ordinary traffic: asleep, its barriers lie 1 ms of launching
#: apart, not the hook's 0.2 ms of GPU time, and a server that does not call request() waits
#: for the difference (docs/results.md, "Gates that sleep after 1 ms").
DEFAULT_SLEEP_AFTER_S = 1.0


def sleepers(
    snapshot: Snapshot, after_s: float = DEFAULT_SLEEP_AFTER_S
) -> tuple[frozenset[int], float | None]:
    """The gated tasks whose gate may sleep now, and the daemon time at which another one may
    (None: none until something changes). ``after_s`` <= 0: never."""
    if after_s <= 0:
        return frozenset(), None
    by_gpu = snapshot.by_gpu()
    allowed: set[int] = set()
    next_at: float | None = None
    for task in snapshot.tasks:
        if not task.gated or task.suspended or task.held:
            continue
        wait_s = 0.0
        blocked = False
        for gpu in task.gpus:
            for other in by_gpu[gpu]:
                if other.task_id == task.task_id:
                    continue
                below = other.priority < task.priority and not task.hinted
                if below or (other.priority == task.priority and other.gated):
                    blocked = True
                elif other.priority > task.priority:
                    if other.active:
                        blocked = True
                    else:
                        wait_s = max(wait_s, after_s - other.idle_s)
        if blocked:
            continue
        if wait_s <= 0:
            allowed.add(task.task_id)
        else:
            due = snapshot.now + wait_s
            next_at = due if next_at is None else min(next_at, due)
    return frozenset(allowed), next_at
