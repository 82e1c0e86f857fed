"""A task's state, its record, and the one function that changes it.

A task's state and the data that belongs to it (since when the task is suspended and by which
mechanism, since when it is preempted: waiting for a more important task, or held, the
backstop's clock; why its suspension failed) are one frozen :class:`StateRecord`, which this
module alone replaces. Every change goes through :func:`change_state`, which refuses a
transition the daemon never makes (:class:`StateError`); the daemon changes states through
:class:`StateLog`, which tells each change (its event, its metric).

Not states, and kept as fields of the task: ``held`` (an operator's wish, which the plan
honours like a priority), ``backstop_locked`` (a driver lock added behind a closed gate,
whatever the task waits for) and ``evict_unlock`` (how to undo an eviction's lock).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..errors import GpreemptError
from ..names import MechanismName


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


@dataclass(frozen=True)
class StateRecord:
    """Where a task stands with the GPU, and since when."""

    state: TaskState = TaskState.RUNNING
    #: Concrete mechanism that suspended it (resume with the same one); the last one, once
    #: it runs again.
    suspended_with: str | None = None
    suspended_since: float | None = None
    #: Since when it is suspended for a reason other than waiting for its turn among peers
    #: (a more important task, or held); None while it runs or only waits for its turn.
    preempted_since: float | None = None
    #: Why the policy's last suspension of it failed, while the policy still wants it
    #: suspended (state ``unprotected``); None otherwise.
    suspend_error: str | None = None


class Stateful(Protocol):
    """What :func:`change_state` reads and writes of a task (task.Task)."""

    state_record: StateRecord

    @property
    def name(self) -> str: ...

    @property
    def pid(self) -> int: ...


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
    record = task.state_record
    old = record.state
    if new not in TRANSITIONS[old]:
        raise StateError(
            f"task {task.name!r} (pid {task.pid}) cannot go from {old.value} to {new.value}"
        )
    error_now = record.suspend_error
    if new is TaskState.UNPROTECTED:
        if error is None:
            raise StateError(f"task {task.name!r} is unprotected only with a reason")
        error_now = error
    elif new is not TaskState.EVICTED:
        error_now = None  # suspended after all, or no longer wanted suspended
    suspended_with, suspended_since = record.suspended_with, record.suspended_since
    if new in STOPPED and old not in STOPPED:
        if mechanism is None:
            raise StateError(f"task {task.name!r} is suspended only by a mechanism")
        suspended_with, suspended_since = mechanism, now
    elif new not in STOPPED:
        suspended_since = None
    preempted = new in (TaskState.SUSPENDED, TaskState.EVICTED)
    task.state_record = StateRecord(
        state=new,
        suspended_with=suspended_with,
        suspended_since=suspended_since,
        preempted_since=(record.preempted_since or now) if preempted else None,
        suspend_error=error_now,
    )


class EventSink(Protocol):
    """Where a change is written (the daemon's event log, event_log.py)."""

    def write(self, event: str, **fields: Any) -> Any: ...


class Told(Stateful, Protocol):
    """What :class:`StateLog` reads of a task besides its state record (task.Task)."""

    @property
    def state(self) -> TaskState: ...

    @property
    def suspended_since(self) -> float | None: ...

    @property
    def suspend_error(self) -> str | None: ...

    @property
    def gpu(self) -> int: ...

    def event_fields(self) -> dict[str, Any]: ...


class StateLog:
    """Changes tasks' states and tells each change: its line in the event log and the metric
    that counts it. The daemon's executor (apply.py, apply_memory.py) changes a task's state
    through it alone; what it ran (counters, locks) it keeps itself."""

    def __init__(self, events: EventSink, metrics: Any = None) -> None:
        self.events = events
        #: The Prometheus metrics (prometheus.py), or None when they are off.
        self.metrics = metrics

    def suspended(
        self, task: Told, *, turn: bool, mechanism: str, latency_ms: float, reason: str, now: float
    ) -> None:
        """``mechanism`` stopped ``task``: for a peer's turn (``turn``) or for ``reason``."""
        change_state(
            task,
            TaskState.WAITING_TURN if turn else TaskState.SUSPENDED,
            now=now,
            mechanism=mechanism,
        )
        self.events.write(
            "suspend",
            **task.event_fields(),
            mechanism=mechanism,
            latency_ms=latency_ms,
            reason=reason,
        )
        if self.metrics is not None and turn:
            self.metrics.on_turn(task.gpu, task.name)
        elif self.metrics is not None:
            self.metrics.on_suspend(task.gpu, task.name, mechanism, latency_ms / 1e3)

    def unprotected(self, task: Told, *, mechanism: str, reason: str, now: float) -> bool:
        """The policy wants ``task`` suspended and ``mechanism`` failed for ``reason``: the
        metric counts every failure, the event log one line per new reason (not one per
        retry). Returns whether the task's state changed."""
        if self.metrics is not None:
            self.metrics.on_suspend_failed(task.gpu, task.name, mechanism)
        if task.suspend_error == reason:
            return False
        change_state(task, TaskState.UNPROTECTED, now=now, error=reason)
        self.events.write("error", **task.event_fields(), mechanism=mechanism, reason=reason)
        return True

    def protected_again(self, task: Told, *, now: float) -> None:
        """The policy no longer wants ``task`` suspended, whose last suspension failed: it is
        no longer unprotected (it runs; evicted since, it only forgets why)."""
        if task.state is TaskState.UNPROTECTED:
            change_state(task, TaskState.RUNNING, now=now)
        else:
            task.state_record = replace(task.state_record, suspend_error=None)

    def resumed(
        self, task: Told, *, mechanism: str, latency_ms: float, reason: str, now: float
    ) -> float:
        """``mechanism`` let ``task`` run again; returns how long it was suspended (s)."""
        suspended_for = now - (task.suspended_since or now)
        change_state(task, TaskState.RUNNING, now=now)
        self.events.write(
            "resume",
            **task.event_fields(),
            mechanism=mechanism,
            latency_ms=latency_ms,
            reason=reason,
            suspended_ms=round(suspended_for * 1e3, 4),
        )
        if self.metrics is not None:
            self.metrics.on_resume(task.gpu, task.name, suspended_for)
        return suspended_for

    def evicted(self, task: Told, *, moved: int, seconds: float, reason: str, now: float) -> None:
        """``task``'s ``moved`` bytes of GPU memory went to the host in ``seconds`` (the
        driver lock holds it: the mechanism, where it ran until now)."""
        change_state(task, TaskState.EVICTED, now=now, mechanism=MechanismName.LOCK)
        self._memory_moved("evict", task, moved, seconds, reason)
        if self.metrics is not None:
            self.metrics.on_evict(task.gpu, task.name, moved, seconds)

    def restored(self, task: Told, *, moved: int, seconds: float, reason: str, now: float) -> None:
        """``task``'s memory came back; it stays suspended until a pass lets it run."""
        change_state(task, TaskState.SUSPENDED, now=now)
        self._memory_moved("restore", task, moved, seconds, reason)
        if self.metrics is not None:
            self.metrics.on_restore(task.gpu, task.name, moved, seconds)

    def settled(self, task: Told, new: TaskState, *, now: float) -> None:
        """A change nobody is told of: what a suspended task waits for changed (its turn, a
        more important task), or the policy no longer wants an unprotected task stopped."""
        change_state(task, new, now=now)

    def _memory_moved(
        self, event: str, task: Told, moved: int, seconds: float, reason: str
    ) -> None:
        self.events.write(
            event,
            **task.event_fields(),
            mechanism="evict",
            latency_ms=seconds * 1e3,
            reason=reason,
            bytes=moved,
            gb_per_s=round(moved / seconds / 1e9, 3) if seconds > 0 else None,
        )
