"""Which more important tasks each task's gate watches directly.

Under strict priority (hpf) a task is suspended exactly while a more important task sharing
its GPU is active. The daemon learns of that activity through a doorbell and then closes the
task's gate: a few hundred microseconds of Python in between, during which the task keeps
launching in front of the request. So the daemon also lets each gated task read the activity
words of the tasks that outrank it: its gate stops by itself, at its next operator, the moment
one of them becomes active. The daemon still closes and opens the gate as before; the watch
only moves the stop earlier.
"""

from __future__ import annotations

from .snapshot import Snapshot


def watch_lists(snapshot: Snapshot) -> dict[int, frozenset[int]]:
    """Task id -> ids of the tasks whose activity must stop it at once, under hpf.

    Those are the tasks that share a GPU with it and have a higher priority, held ones
    excepted (a held task cannot use the GPU, so under hpf it preempts no one). Tasks absent
    from the answer watch nothing.
    """
    watched: dict[int, frozenset[int]] = {}
    for tasks in snapshot.by_gpu().values():
        for low in tasks:
            higher = frozenset(t.task_id for t in tasks if t.priority > low.priority and not t.held)
            if higher:
                watched[low.task_id] = watched.get(low.task_id, frozenset()) | higher
    return watched
