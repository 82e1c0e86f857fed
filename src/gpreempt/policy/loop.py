"""One pass of a scheduling loop, as a pure function: ``run_pass(policy, state, snapshot)``.

Every scheduler of the project runs the same loop: the daemon (``daemon/reconcile.py``), the
in-process scheduler (``client/scheduler.py``) and the simulator (:mod:`.simulate`). After
each change, and when the last decision asked to be woken, the host takes a snapshot of its
tasks and calls :func:`run_pass`, which

1. credits each task the time it ran since the previous pass (active then, not suspended
   now): the ``run_seconds`` that time-based policies read;
2. asks the policy, handing it back the memory its previous decision returned;
3. says which tasks to suspend and which to resume (the policy's set, plus held tasks); and
4. returns the :class:`LoopState` to hand the next pass.

The host then acts (signals, gate words, instant in the simulator), records the new totals
of ``run_seconds`` it keeps, and arranges to be called again at ``decision.wake_at``. No I/O,
no clock: the host passes its own time as ``snapshot.now``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .snapshot import Decision, Policy, Snapshot


@dataclass(frozen=True)
class LoopState:
    """What one pass hands the next."""

    #: Host time of the previous pass (None: there was none).
    at: float | None = None
    #: What the policy's last decision asked to be handed back (policy/__init__.py).
    memory: Any = None
    #: The tasks that were active at the previous pass: they ran since, unless suspended.
    active: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Pass:
    """One pass's outcome."""

    #: What the policy saw: the host's snapshot with ``run_seconds`` credited up to now.
    snapshot: Snapshot
    decision: Decision
    #: Tasks to suspend now: wanted suspended (by the policy, or held) and not suspended yet.
    suspend: frozenset[int]
    #: Tasks to resume now: suspended, and wanted neither by the policy nor held.
    resume: frozenset[int]
    #: Hand this to the next pass.
    state: LoopState

    @property
    def wake_at(self) -> float | None:
        """When to run a pass again even if nothing changes (None: on the next change)."""
        return self.decision.wake_at

    def run_seconds(self) -> dict[int, float]:
        """Each task's total run time, credited up to this pass (for the host to keep)."""
        return {view.task_id: view.run_seconds for view in self.snapshot.tasks}


def credit_run_time(state: LoopState, snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with the time since the previous pass added to the ``run_seconds`` of
    each task that ran over it: active at that pass and not suspended now."""
    if state.at is None:
        return snapshot
    elapsed = max(0.0, snapshot.now - state.at)
    if not elapsed:
        return snapshot
    return dataclasses.replace(
        snapshot,
        tasks=tuple(
            dataclasses.replace(view, run_seconds=view.run_seconds + elapsed)
            if view.task_id in state.active and not view.suspended
            else view
            for view in snapshot.tasks
        ),
    )


def run_pass(policy: Policy, state: LoopState, snapshot: Snapshot) -> Pass:
    """One pass over ``snapshot`` (the host's tasks at its time ``snapshot.now``, each with
    the ``run_seconds`` of the previous pass): credit run time, ask ``policy``, and say whom
    to suspend and resume."""
    seen = credit_run_time(state, snapshot)
    decision = policy(seen, state.memory)
    wanted = decision.suspend | {view.task_id for view in seen.tasks if view.held}
    suspended = {view.task_id for view in seen.tasks if view.suspended}
    known = {view.task_id for view in seen.tasks}
    return Pass(
        snapshot=seen,
        decision=decision,
        suspend=frozenset((wanted & known) - suspended),
        resume=frozenset(suspended - wanted),
        state=LoopState(
            at=seen.now,
            memory=decision.memory,
            active=frozenset(view.task_id for view in seen.tasks if view.active),
        ),
    )


__all__ = ["LoopState", "Pass", "Policy", "credit_run_time", "run_pass"]
