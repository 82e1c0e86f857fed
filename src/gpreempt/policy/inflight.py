"""How much GPU work each less important task may keep in flight.

When a more important task starts, it waits for whatever the less important tasks on its GPU
have already queued: the drain. Each gated task bounds its own queue, so the drain grows with
the number of them. The daemon therefore gives every GPU one in-flight budget and splits it
equally among the tasks there that someone more important could preempt and that may launch
at the same time (peers that take turns count once, policy/turns.py); each task's gate bounds
its tight window by its share.
"""

from __future__ import annotations

from .snapshot import Snapshot
from .turns import launch_slots, turn_groups

#: GPU time (ms) that the preemptible tasks of one GPU keep in flight together, by default.
DEFAULT_BUDGET_MS = 1.0


def inflight_shares(
    snapshot: Snapshot, budget_ms: float = DEFAULT_BUDGET_MS, turns: bool = False
) -> dict[int, float]:
    """Task id -> the GPU time (ms) it may keep in flight, for every task that shares a GPU
    with a more important task; tasks not in the answer have no limit from the daemon.

    Held tasks launch nothing and take no share. With ``turns``, the peers that take turns
    share one part. A task on several GPUs gets the smallest of its shares.
    """
    if budget_ms <= 0:
        return {}
    slots = launch_slots(snapshot, turn_groups(snapshot) if turns else None)
    shares: dict[int, float] = {}
    for gpu, tasks in snapshot.by_gpu().items():
        top = max(t.priority for t in tasks)
        for task in tasks:
            if task.priority < top and not task.held:
                share = budget_ms / slots[gpu]
                shares[task.task_id] = min(share, shares.get(task.task_id, share))
    return shares
