"""A task's state, and the one function that changes it.

Every change of a task's state goes through :func:`change_state`, which refuses a transition
the daemon never makes (:class:`StateError`) and keeps the data that belongs to the state:
since when the task is suspended and by which mechanism, since when it is preempted (waiting
for a more important task, or held: the backstop's clock), why its suspension failed.

Not states, and kept as fields of the task: ``held`` (an operator's wish, which the plan
honours like a priority), ``backstop_locked`` (a driver lock added behind a closed gate,
whatever the task waits for) and ``evict_unlock`` (how to undo an eviction's lock).
"""

from __future__ import annotations

import enum
from typing import Protocol

from ..errors import GpreemptError


class TaskState(enum.Enum):
    """Where a task stands with the GPU. The values are what ``status`` shows."""

    #: It may use the GPU.
    RUNNING = "running"
    #: The policy wants it suspended and its mechanism failed: it runs (``suspend_error``).
    UNPROTECTED = "unprotected"
    #: Suspended for a more important task, or held by hand.
    SUSPENDED = "suspended"
    #: Suspended only until its turn among gated peers of equal priority (policy/turns.py).
    WAITING_TURN = "waiting_turn"
    #: Suspended, and its GPU memory moved to the host (memory.py).
    EVICTED = "evicted"


#: The states in which the task cannot use the GPU.
STOPPED = frozenset({TaskState.SUSPENDED, TaskState.WAITING_TURN, TaskState.EVICTED})

#: Each state and the states the daemon may move a task to from it.
TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    # suspended (for a task or a turn), or its suspension failed, or evicted while running
    TaskState.RUNNING: frozenset(
        {TaskState.SUSPENDED, TaskState.WAITING_TURN, TaskState.UNPROTECTED, TaskState.EVICTED}
    ),
    # as from running; a new reason for the failure; or the policy no longer wants it stopped
    TaskState.UNPROTECTED: frozenset(
        {
            TaskState.SUSPENDED,
            TaskState.WAITING_TURN,
            TaskState.UNPROTECTED,
            TaskState.EVICTED,
            TaskState.RUNNING,
        }
    ),
    # resumed; only its turn left to wait for; evicted
    TaskState.SUSPENDED: frozenset({TaskState.RUNNING, TaskState.WAITING_TURN, TaskState.EVICTED}),
    # resumed; a more important task started; evicted
    TaskState.WAITING_TURN: frozenset({TaskState.RUNNING, TaskState.SUSPENDED, TaskState.EVICTED}),
    # restored (still locked: suspended until a scheduling pass lets it run); or it ended
    TaskState.EVICTED: frozenset({TaskState.SUSPENDED, TaskState.RUNNING}),
}


class Stateful(Protocol):
    """What :func:`change_state` reads and writes of a task (registry.Task)."""

    name: str
    pid: int
    state: TaskState
    suspended_with: str | None
    suspended_since: float | None
    preempted_since: float | None
    suspend_error: str | None


class StateError(GpreemptError):
    """A change of state the daemon never makes: a bug, said with the task and both states."""


def change_state(
    task: Stateful,
    new: TaskState,
    *,
    now: float,
    mechanism: str | None = None,
    error: str | None = None,
) -> None:
    """Move ``task`` to ``new`` at daemon time ``now`` (monotonic seconds).

    ``mechanism``: what suspended it, when it could use the GPU until now (required then,
    ignored otherwise). ``error``: why its suspension failed, for
    :attr:`TaskState.UNPROTECTED` (required then).
    Raises :class:`StateError` for a transition not in :data:`TRANSITIONS`.
    """
    old = task.state
    if new not in TRANSITIONS[old]:
        raise StateError(
            f"task {task.name!r} (pid {task.pid}) cannot go from {old.value} to {new.value}"
        )
    if new is TaskState.UNPROTECTED:
        if error is None:
            raise StateError(f"task {task.name!r} is unprotected only with a reason")
        task.suspend_error = error
    elif new is not TaskState.EVICTED:
        task.suspend_error = None  # suspended after all, or no longer wanted suspended
    if new in STOPPED and old not in STOPPED:
        if mechanism is None:
            raise StateError(f"task {task.name!r} is suspended only by a mechanism")
        task.suspended_with = mechanism
        task.suspended_since = now
    elif new not in STOPPED:
        task.suspended_since = None
    if new in (TaskState.SUSPENDED, TaskState.EVICTED):
        task.preempted_since = task.preempted_since or now
    else:
        task.preempted_since = None
    task.state = new
