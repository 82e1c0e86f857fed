"""The policy simulator itself: exact accounting, and it catches policies that would spin."""

from __future__ import annotations

import pytest

from gpreempt.policy import Decision, Snapshot
from gpreempt.policy.simulate import SimTask, simulate


def run_everything(snapshot: Snapshot, memory: object) -> Decision:
    return Decision(suspend=frozenset())


def test_active_intervals_are_counted_exactly() -> None:
    tasks = [SimTask(1, active=((0.5, 1.5), (2.0, 2.25))), SimTask(2)]
    result = simulate(run_everything, tasks, duration=3.0)
    assert result.run_seconds == pytest.approx({1: 1.25, 2: 3.0})
    assert result.shares()[2] == pytest.approx(1.0)


def test_held_tasks_do_not_run() -> None:
    result = simulate(run_everything, [SimTask(1, held=True)], duration=1.0)
    assert result.run_seconds[1] == 0.0


def test_policy_waking_in_the_past_is_an_error() -> None:
    def backwards(snapshot: Snapshot, memory: object) -> Decision:
        return Decision(suspend=frozenset(), wake_at=snapshot.now - 1.0)

    with pytest.raises(RuntimeError, match="before now"):
        simulate(backwards, [SimTask(1)], duration=1.0)


def test_policy_waking_at_the_same_instant_forever_is_an_error() -> None:
    def spinning(snapshot: Snapshot, memory: object) -> Decision:
        return Decision(suspend=frozenset(), wake_at=snapshot.now)

    with pytest.raises(RuntimeError, match="keeps asking"):
        simulate(spinning, [SimTask(1)], duration=1.0)


def test_duplicate_task_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        simulate(run_everything, [SimTask(1), SimTask(1)], duration=1.0)
