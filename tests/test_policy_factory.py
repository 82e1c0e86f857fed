"""make_policy: a policy built by name carries what the daemon must know of it."""

from __future__ import annotations

import pytest

from gpreempt.errors import UsageError
from gpreempt.policy import POLICIES, PolicySettings, Snapshot, TaskView, make_policy


def _task(task_id: int, priority: int, active: bool) -> TaskView:
    return TaskView(task_id=task_id, priority=priority, gpus=(0,), active=active)


def test_every_listed_policy_builds_and_decides() -> None:
    snapshot = Snapshot(tasks=(_task(1, 100, True), _task(2, -100, True)), now=0.0)
    for name in POLICIES:
        built = make_policy(name)
        assert built.name == name
        built.decide(snapshot, None)  # a Decision, whatever it says


def test_hpf_is_strict_priority_with_turns() -> None:
    built = make_policy("hpf", PolicySettings(turn_ms=20.0, inflight_budget_ms=1.0))
    assert built.strict_priority and built.turn_ms == 20.0
    snapshot = Snapshot(tasks=(_task(1, 100, True), _task(2, -100, True)), now=0.0)
    assert built.decide(snapshot, None).suspend == frozenset({2})


def test_turns_off_and_other_policies_neither_watch_nor_take_turns() -> None:
    assert make_policy("hpf", PolicySettings(turn_ms=0.0)).turn_ms == 0.0
    for name in ("timeslice", "share"):
        built = make_policy(name, PolicySettings(turn_ms=20.0))
        assert not built.strict_priority and built.turn_ms == 0.0


def test_unknown_policy_is_one_clear_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown policy 'fifo': choose one of hpf, share"):
        make_policy("fifo")
