"""Which more important tasks each task's gate watches directly.

Under strict priority (hpf) a task is suspended exactly while a more important task sharing
its GPU is active. The daemon learns of that activity through a doorbell and then closes the
task's gate: a few hundred microseconds of Python in between, during which the task keeps
launching in front of the request. So the daemon also lets each gated task read the activity
words of the tasks that outrank it: its gate stops by itself, at its next operator, the moment
one of them becomes active. The daemon still closes and opens the gate as before; the watch
moves the stop earlier.

It moves the start earlier too. When a request ends, the daemon again needs a few hundred
microseconds to notice and open the gates it closed, and the GPU idles meanwhile, once per
request. So when a task is suspended only because more important tasks are active (the
policy's ``Decision.until_idle``) and its gate watches every one of them (:func:`waited_for`),
the daemon closes its gate only while they are active, and the gate goes on by itself as soon
as none is (``gpreempt.control.released_by_watch``).
"""

from __future__ import annotations

from collections.abc import Iterable

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


def waited_for(snapshot: Snapshot, task_ids: Iterable[int]) -> dict[int, frozenset[int]]:
    """Task id -> the tasks whose activity keeps it suspended under hpf, for each of
    ``task_ids``: the active, not held, more important tasks that share a GPU with it."""
    wanted = set(task_ids)
    waits: dict[int, frozenset[int]] = {}
    for tasks in snapshot.by_gpu().values():
        for low in tasks:
            if low.task_id in wanted:
                above = frozenset(
                    t.task_id
                    for t in tasks
                    if t.priority > low.priority and t.active and not t.held
                )
                waits[low.task_id] = waits.get(low.task_id, frozenset()) | above
    return waits
