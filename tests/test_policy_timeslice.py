"""timeslice: active tasks on one GPU take turns of their slice."""

from __future__ import annotations

import math
import random

import pytest
from conftest import task_view as view

from gpreempt.errors import UsageError
from gpreempt.policy import Decision, Snapshot, decide_timeslice, get_policy
from gpreempt.policy.simulate import SimTask, simulate
from gpreempt.policy.timeslice import (
    HIGH_SLICE_MS,
    LOW_SLICE_MS,
    MIN_SLICE_MS,
    NORMAL_SLICE_MS,
    check_timeslice_ms,
    default_slice_ms,
    slice_seconds,
)


def decide(now: float, tasks, memory=None) -> Decision:
    return decide_timeslice(Snapshot(now=now, tasks=tuple(tasks)), memory)


def test_registered() -> None:
    assert get_policy("timeslice") is decide_timeslice


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        (255, HIGH_SLICE_MS),
        (100, HIGH_SLICE_MS),
        (99, NORMAL_SLICE_MS),
        (0, NORMAL_SLICE_MS),
        (-99, NORMAL_SLICE_MS),
        (-100, LOW_SLICE_MS),
        (-255, LOW_SLICE_MS),
    ],
)
def test_default_slices_by_priority(priority: int, expected: float) -> None:
    assert default_slice_ms(priority) == expected


def test_high_and_low_default_to_80_and_20_ms() -> None:
    assert (default_slice_ms(100), default_slice_ms(-100)) == (80.0, 20.0)


@pytest.mark.parametrize("asked", [None, 0.0, -5.0, math.nan, math.inf])
def test_missing_or_unusable_timeslice_falls_back_to_default(asked) -> None:
    assert slice_seconds(view(1, 100, timeslice_ms=asked)) == pytest.approx(0.080)


def test_tiny_timeslice_is_raised_to_the_minimum() -> None:
    assert slice_seconds(view(1, 100, timeslice_ms=0.2)) == pytest.approx(MIN_SLICE_MS / 1000)


def test_asked_timeslice_is_used() -> None:
    assert slice_seconds(view(1, 100, timeslice_ms=5)) == pytest.approx(0.005)


@pytest.mark.parametrize("bad", ["x", "", "0", "-3", "0.5", "inf", "nan"])
def test_check_timeslice_ms_refuses_bad_values(bad: str) -> None:
    with pytest.raises(UsageError, match="--timeslice-ms"):
        check_timeslice_ms(bad)


def test_check_timeslice_ms_accepts_milliseconds() -> None:
    assert check_timeslice_ms("12.5") == 12.5


def test_lone_active_task_runs_without_wake() -> None:
    decision = decide(1.0, [view(1, 100), view(2, -100, active=False)])
    assert decision.suspend == frozenset()
    assert decision.wake_at is None


def test_two_active_tasks_take_turns() -> None:
    tasks = [view(1, 100), view(2, -100)]
    first = decide(1.0, tasks)
    assert first.suspend == {2}
    assert first.wake_at == pytest.approx(1.080)
    # Asked again before the slice ends (some unrelated change): nothing moves.
    again = decide(1.05, tasks, first.memory)
    assert again.suspend == {2}
    assert again.wake_at == first.wake_at
    second = decide(first.wake_at, tasks, again.memory)
    assert second.suspend == {1}
    assert second.wake_at == pytest.approx(1.100)
    third = decide(second.wake_at, tasks, second.memory)
    assert third.suspend == {2}
    assert third.wake_at == pytest.approx(1.180)


def test_a_late_switch_does_not_lengthen_the_next_slice() -> None:
    """The daemon switches 5 ms late: the next turn still ends one slice after the last one
    ended, so both tasks keep their shares (turns started at the late moments would give 85
    and 25 ms: 3.4 to 1 instead of 4)."""
    tasks = [view(1, 100), view(2, -100)]
    first = decide(1.0, tasks)  # 1 until 1.080
    second = decide(1.085, tasks, first.memory)
    assert second.suspend == {1} and second.wake_at == pytest.approx(1.100)
    third = decide(1.105, tasks, second.memory)
    assert third.suspend == {2} and third.wake_at == pytest.approx(1.180)


def test_a_switch_far_behind_or_after_a_turn_ended_early_starts_now() -> None:
    tasks = [view(1, 100), view(2, -100)]
    first = decide(1.0, tasks)  # 1 until 1.080
    # more than half of 2's 20 ms slice late: a slice of its own from now
    late = decide(1.095, tasks, first.memory)
    assert late.suspend == {1} and late.wake_at == pytest.approx(1.115)
    # 1 went idle at 1.030, before its turn ran out: 2's turn starts then
    idle = [view(1, 100, active=False), view(2, -100)]
    early = decide(1.030, idle, first.memory)
    assert early.suspend == frozenset()
    back = decide(1.040, tasks, early.memory)
    assert back.suspend == {1} and back.wake_at == pytest.approx(1.050)


def test_rotation_order_is_priority_then_task_id() -> None:
    tasks = [view(3, 0), view(2, 0), view(1, 100), view(4, -100)]
    memory = None
    now = 0.0
    order = []
    for _ in range(8):
        decision = decide(now, tasks, memory)
        (running,) = {t.task_id for t in tasks} - decision.suspend
        order.append(running)
        memory, now = decision.memory, decision.wake_at
    assert order == [1, 2, 3, 4, 1, 2, 3, 4]


def test_inactive_tasks_are_never_suspended() -> None:
    tasks = [view(1, 0), view(2, 0), view(3, 100, active=False)]
    decision = decide(0.0, tasks)
    assert 3 not in decision.suspend
    assert decision.suspend == {2}


def test_held_tasks_neither_take_turns_nor_appear() -> None:
    tasks = [view(1, 100, held=True), view(2, 0)]
    decision = decide(0.0, tasks)
    assert decision.suspend == frozenset()
    assert decision.wake_at is None


def test_task_going_idle_ends_its_turn_at_once() -> None:
    tasks = [view(1, 100), view(2, 0), view(3, -100)]
    first = decide(0.0, tasks)
    assert first.suspend == {2, 3}
    tasks[0] = view(1, 100, active=False)
    second = decide(0.010, tasks, first.memory)
    assert second.suspend == {3}
    assert second.wake_at == pytest.approx(0.010 + NORMAL_SLICE_MS / 1000)


def test_turn_passes_on_after_the_idle_task_even_when_it_was_last() -> None:
    tasks = [view(1, 100), view(2, -100)]
    memory = decide(0.0, tasks).memory
    memory = decide(0.080, tasks, memory).memory  # task 2's turn
    tasks = [view(1, 100), view(2, -100, active=False), view(3, -100)]
    decision = decide(0.085, tasks, memory)
    assert decision.suspend == {1}  # 3 comes after 2 in the order
    assert decision.wake_at == pytest.approx(0.085 + LOW_SLICE_MS / 1000)


def test_task_becoming_active_joins_the_rotation() -> None:
    tasks = [view(1, 0), view(3, 0)]
    first = decide(0.0, tasks)
    assert first.suspend == {3}
    tasks.append(view(2, 0))
    joined = decide(0.020, tasks, first.memory)
    assert joined.suspend == {2, 3}  # task 1 keeps its slice
    nxt = decide(joined.wake_at, tasks, joined.memory)
    assert nxt.suspend == {1, 3}  # task 2 comes before task 3


def test_lone_task_keeps_its_slice_when_another_joins_early() -> None:
    alone = decide(0.0, [view(1, -100)])
    decision = decide(0.005, [view(1, -100), view(2, 100)], alone.memory)
    assert decision.suspend == {2}
    assert decision.wake_at == pytest.approx(0.020)


def test_lone_task_running_long_yields_when_another_joins() -> None:
    alone = decide(0.0, [view(1, -100)])
    decision = decide(5.0, [view(1, -100), view(2, 100)], alone.memory)
    assert decision.suspend == {1}
    assert decision.wake_at == pytest.approx(5.080)


def test_gpus_rotate_independently_and_wake_at_the_earliest_turn_end() -> None:
    tasks = [
        view(1, 100, gpus=(0,)),
        view(2, 100, gpus=(0,)),
        view(3, -100, gpus=(1,)),
        view(4, -100, gpus=(1,)),
    ]
    decision = decide(0.0, tasks)
    assert decision.suspend == {2, 4}
    assert decision.wake_at == pytest.approx(0.020)


def test_multi_gpu_task_is_suspended_if_any_gpu_gives_the_turn_away() -> None:
    tasks = [view(1, 0, gpus=(0, 1)), view(2, 100, gpus=(1,)), view(3, -100, gpus=(0,))]
    decision = decide(0.0, tasks)
    # GPU 0: task 1 before task 3; GPU 1: task 2 before task 1. Task 1 loses on GPU 1.
    assert decision.suspend == {1, 3}


def test_memory_is_not_mutated_and_decisions_are_repeatable() -> None:
    tasks = [view(1, 100), view(2, -100)]
    first = decide(0.0, tasks)
    snapshot_of_memory = dict(first.memory)
    a = decide(0.080, tasks, first.memory)
    b = decide(0.080, tasks, first.memory)
    assert first.memory == snapshot_of_memory
    assert (a.suspend, a.wake_at) == (b.suspend, b.wake_at)


def test_simulation_80_20_splits_four_to_one() -> None:
    result = simulate(
        decide_timeslice, [SimTask(1, priority=100), SimTask(2, priority=-100)], duration=10.0
    )
    ratio = result.run_seconds[1] / result.run_seconds[2]
    assert 4.0 * 0.85 <= ratio <= 4.0 * 1.15
    assert result.run_seconds[1] + result.run_seconds[2] == pytest.approx(10.0)


def test_simulation_asked_slices_set_the_split() -> None:
    tasks = [SimTask(1, timeslice_ms=30), SimTask(2, timeslice_ms=10), SimTask(3, timeslice_ms=10)]
    shares = simulate(decide_timeslice, tasks, duration=5.0).shares()
    assert shares[1] == pytest.approx(0.6, abs=0.02)
    assert shares[2] == pytest.approx(0.2, abs=0.02)
    assert shares[3] == pytest.approx(0.2, abs=0.02)


def test_simulation_bursty_task_runs_alone_when_the_other_is_idle() -> None:
    tasks = [SimTask(1, priority=100, active=((0.0, 1.0),)), SimTask(2, priority=-100)]
    result = simulate(decide_timeslice, tasks, duration=2.0)
    # First second shared 4:1, second second all for task 2.
    assert result.run_seconds[1] == pytest.approx(0.8, abs=0.08)
    assert result.run_seconds[2] == pytest.approx(1.2, abs=0.08)
    assert result.trace[-1][1] == frozenset()


def _random_tasks(seed: int) -> list[SimTask]:
    rng = random.Random(seed)
    tasks = []
    for task_id in range(1, rng.randint(2, 6) + 1):
        intervals, t = [], 0.0
        while t < 3.0:
            start = t + rng.uniform(0.0, 0.3)
            end = start + rng.uniform(0.005, 0.5)
            intervals.append((start, end))
            t = end
        tasks.append(
            SimTask(
                task_id,
                priority=rng.choice([-100, 0, 100]),
                gpus=(rng.randint(0, 1),),
                active=None if rng.random() < 0.3 else tuple(intervals),
                timeslice_ms=rng.choice([None, 5.0, 30.0]),
            )
        )
    return tasks


@pytest.mark.parametrize("seed", range(20))
def test_random_workloads_one_task_at_a_time_and_idle_ones_untouched(seed: int) -> None:
    tasks = _random_tasks(seed)
    result = simulate(decide_timeslice, tasks, duration=3.0)
    for now, suspended_ids in result.trace:
        for gpu in (0, 1):
            active = [t.task_id for t in tasks if t.gpus == (gpu,) and t.is_active(now)]
            running = [i for i in active if i not in suspended_ids]
            assert len(running) == (1 if active else 0)
        assert all(t.is_active(now) for t in tasks if t.task_id in suspended_ids)
