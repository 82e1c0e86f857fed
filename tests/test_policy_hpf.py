"""hpf: strict priority per GPU."""

from __future__ import annotations

import pytest
from conftest import task_view as view

from gpreempt.errors import UsageError
from gpreempt.policy import POLICIES, Snapshot, TaskView, decide_hpf, get_policy
from gpreempt.policy.simulate import SimTask, simulate


def suspended(*tasks: TaskView) -> set[int]:
    decision = decide_hpf(Snapshot(now=5.0, tasks=tasks))
    assert decision.wake_at is None
    return set(decision.suspend)


def test_registered_policies() -> None:
    assert set(POLICIES) == {"hpf", "timeslice", "share"}
    assert get_policy("hpf") is decide_hpf
    with pytest.raises(UsageError, match="hpf, share, timeslice"):
        get_policy("fifo")


def test_no_tasks_nothing_to_do() -> None:
    assert suspended() == set()


def test_higher_priority_active_task_suspends_lower_ones() -> None:
    assert suspended(view(1, 100), view(2, 0), view(3, -100)) == {2, 3}


def test_inactive_high_task_suspends_no_one() -> None:
    assert suspended(view(1, 100, active=False), view(2, -100)) == set()


def test_most_important_active_task_sets_the_bar() -> None:
    # The high task is idle, so normal runs and only low waits.
    assert suspended(view(1, 100, active=False), view(2, 0), view(3, -100)) == {3}


@pytest.mark.parametrize("priority", [-100, 0, 7, 255])
def test_equal_priorities_never_suspend_each_other(priority: int) -> None:
    assert suspended(view(1, priority), view(2, priority), view(3, priority)) == set()


def test_held_task_preempts_no_one() -> None:
    assert suspended(view(1, 100, held=True), view(2, -100)) == set()


def test_held_task_is_not_listed_but_still_held_by_the_daemon() -> None:
    # hpf does not list held tasks that nobody outranks; the daemon keeps them suspended.
    assert suspended(view(1, 100), view(2, 100, held=True)) == set()


def test_gpus_are_independent() -> None:
    tasks = (view(1, 100, gpus=(0,)), view(2, -100, gpus=(1,)), view(3, -100, gpus=(0,)))
    assert suspended(*tasks) == {3}


def test_multi_gpu_task_preempts_on_every_gpu() -> None:
    tasks = (view(1, 100, gpus=(0, 1)), view(2, 0, gpus=(0,)), view(3, 0, gpus=(1,)))
    assert suspended(*tasks) == {2, 3}


def test_multi_gpu_task_is_suspended_if_outranked_on_any_gpu() -> None:
    tasks = (view(1, 0, gpus=(0, 1)), view(2, 100, gpus=(1,)), view(3, -100, gpus=(2,)))
    assert suspended(*tasks) == {1}


@pytest.mark.parametrize("low_active", [None, ((1.0, 2.0), (3.0, 9.0))])
def test_simulation_low_task_gets_nothing_while_high_runs(low_active) -> None:
    result = simulate(
        decide_hpf,
        [SimTask(1, priority=100), SimTask(2, priority=-100, active=low_active)],
        duration=10.0,
    )
    assert result.run_seconds[2] == 0.0
    assert result.run_seconds[1] == pytest.approx(10.0)


def test_simulation_low_task_runs_when_high_is_idle() -> None:
    result = simulate(
        decide_hpf,
        [SimTask(1, priority=100, active=((0.0, 4.0),)), SimTask(2, priority=-100)],
        duration=10.0,
    )
    assert result.run_seconds == pytest.approx({1: 4.0, 2: 6.0})
