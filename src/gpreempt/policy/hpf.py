"""Highest priority first: strict priority per GPU."""

from __future__ import annotations

from typing import Any

from .snapshot import Decision, Snapshot


def decide_hpf(snapshot: Snapshot, memory: Any = None) -> Decision:
    """Suspend every task that shares a GPU with a more important active task.

    A held task cannot use the GPU, so it preempts no one. Equal priorities never
    suspend each other. Nothing is remembered between calls.
    """
    suspend: set[int] = set()
    for tasks in snapshot.by_gpu().values():
        running = [t.priority for t in tasks if t.active and not t.held]
        if not running:
            continue
        top = max(running)
        suspend.update(t.task_id for t in tasks if t.priority < top)
    return Decision(suspend=frozenset(suspend))
