"""Highest priority first: strict priority per GPU."""

from __future__ import annotations

from typing import Any

from .snapshot import Decision, Snapshot
from .turns import TurnSettings, take_turns


def decide_hpf(
    snapshot: Snapshot, memory: Any = None, turns: TurnSettings | None = None
) -> Decision:
    """Suspend every task that shares a GPU with a more important active task.

    A held task cannot use the GPU, so it preempts no one. Equal priorities never suspend
    each other, except that with ``turns`` gated peers below a more important task launch
    one at a time (policy/turns.py); ``memory`` then holds whose turn it is.
    """
    suspend: set[int] = set()
    for tasks in snapshot.by_gpu().values():
        running = [t.priority for t in tasks if t.active and not t.held]
        if not running:
            continue
        top = max(running)
        suspend.update(t.task_id for t in tasks if t.priority < top)
    if turns is None:
        return Decision(suspend=frozenset(suspend), until_idle=frozenset(suspend))
    waiting, wake_at, memory = take_turns(snapshot, memory, turns)
    return Decision(
        suspend=frozenset(suspend | waiting),
        wake_at=wake_at,
        memory=memory,
        turns=waiting - suspend,
        until_idle=frozenset(suspend - waiting),
    )
