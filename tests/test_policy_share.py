"""share: strict priority, plus bursts that keep --min-share tasks at their minimum."""

from __future__ import annotations

import random

import pytest
from conftest import task_view as view

from gpreempt.errors import UsageError
from gpreempt.policy import Decision, Snapshot, decide_hpf, decide_share, get_policy
from gpreempt.policy.share import (
    HEADROOM,
    MIN_BURST_S,
    WINDOW_S,
    ShareMemory,
    burst_seconds,
    check_min_share,
    share_in_window,
    starves_at,
)
from gpreempt.policy.simulate import SimTask, simulate


def decide(now: float, tasks, memory=None) -> Decision:
    return decide_share(Snapshot(now=now, tasks=tuple(tasks)), memory)


def test_registered() -> None:
    assert get_policy("share") is decide_share


def test_window_and_burst_defaults() -> None:
    assert WINDOW_S == 1.0
    assert round(HEADROOM, 6) == 0.2
    assert burst_seconds(0.2) == pytest.approx(0.2 * (1 + HEADROOM))
    assert burst_seconds(0.001) == MIN_BURST_S == pytest.approx(0.010)


@pytest.mark.parametrize("bad", ["x", "0", "-0.1", "1.01", "1.5", "nan", "inf"])
def test_check_min_share_refuses_bad_values(bad: str) -> None:
    with pytest.raises(UsageError, match="--min-share"):
        check_min_share(bad)


def test_check_min_share_accepts_fractions() -> None:
    assert check_min_share("0.25") == 0.25
    assert check_min_share(1) == 1.0


HPF_CASES = [
    (view(1, 100), view(2, 0), view(3, -100)),
    (view(1, 100, active=False), view(2, 0), view(3, -100)),
    (view(1, 5), view(2, 5)),
    (view(1, 100, held=True), view(2, -100)),
    (view(1, 100, gpus=(0, 1)), view(2, 0, gpus=(1,)), view(3, 0, gpus=(2,))),
    (view(1, 0, gpus=(0, 1)), view(2, 100, gpus=(1,))),
]


@pytest.mark.parametrize("tasks", HPF_CASES)
def test_without_min_share_it_is_hpf(tasks) -> None:
    snapshot = Snapshot(now=3.0, tasks=tasks)
    ours = decide_share(snapshot, None)
    assert ours.suspend == decide_hpf(snapshot).suspend
    assert ours.wake_at is None


def test_starved_task_gets_a_burst_then_strict_priority_returns() -> None:
    high, low = view(1, 100), view(2, -100, min_share=0.2)
    first = decide(10.0, [high, low])
    # A task that has not run in the window is below its share: it runs first.
    assert first.suspend == {1}
    # The burst aims 20 % above the 0.2 floor.
    assert first.wake_at == pytest.approx(10.24)
    low = view(2, -100, min_share=0.2, run=0.24)
    after = decide(10.24, [high, low], first.memory)
    assert after.suspend == {2}
    # It ran 0.24 s in [10.0, 10.24]; its share drops to 0.2 once 0.04 s of that has left
    # the window, at 11.04.
    assert after.wake_at == pytest.approx(11.04)
    again = decide(11.04, [high, low], after.memory)
    assert again.suspend == {1}
    assert again.wake_at == pytest.approx(11.28)


def test_task_with_its_share_waits_under_strict_priority() -> None:
    # Ran the whole of the last second alone; the high task then arrives.
    low = view(2, -100, min_share=0.2, run=0.0)
    memory = decide(0.0, [low]).memory
    low = view(2, -100, min_share=0.2, run=1.0)
    decision = decide(1.0, [view(1, 100), low], memory)
    assert decision.suspend == {2}
    # Share drops to 0.2 once [0, 0.8] has left the window.
    assert decision.wake_at == pytest.approx(1.8)


def test_task_that_preempts_no_one_needs_no_burst_or_wake() -> None:
    decision = decide(0.0, [view(1, -100, min_share=0.5), view(2, 100, active=False)])
    assert decision.suspend == {2} or decision.suspend == frozenset()
    assert 1 not in decision.suspend
    assert decision.wake_at is None
    assert decision.memory.bursts == {}


def test_inactive_or_held_task_gets_no_burst() -> None:
    for low in (
        view(2, -100, min_share=0.2, active=False),
        view(2, -100, min_share=0.2, held=True),
    ):
        decision = decide(0.0, [view(1, 100), low])
        assert decision.suspend == {2}
        assert decision.memory.bursts == {}


def test_burst_ends_when_the_task_goes_idle() -> None:
    first = decide(0.0, [view(1, 100), view(2, -100, min_share=0.2)])
    assert first.suspend == {1}
    idle = decide(
        0.05, [view(1, 100), view(2, -100, min_share=0.2, active=False, run=0.05)], first.memory
    )
    assert idle.suspend == {2}
    assert idle.memory.bursts == {}


def test_burst_suspends_every_more_important_task_on_its_gpus() -> None:
    tasks = [
        view(1, 100),
        view(2, 0),
        view(3, -100, min_share=0.1),
        view(4, -200),
        view(5, 100, gpus=(1,)),
    ]
    decision = decide(0.0, tasks)
    assert decision.suspend == {1, 2, 4}
    assert decision.wake_at == pytest.approx(0.1 * (1 + HEADROOM))


def test_multi_gpu_burst_clears_all_its_gpus() -> None:
    tasks = [
        view(1, 100, gpus=(0,)),
        view(2, 100, gpus=(1,)),
        view(3, 0, gpus=(0, 1), min_share=0.3),
    ]
    decision = decide(0.0, tasks)
    assert decision.suspend == {1, 2}


def test_bursts_on_one_gpu_do_not_overlap() -> None:
    tasks = [view(1, 100), view(2, -100, min_share=0.2), view(3, -50, min_share=0.2)]
    decision = decide(0.0, tasks)
    (bursting,) = decision.memory.bursts
    assert bursting == 3  # equally starved: the more important one goes first
    assert decision.suspend == {1, 2}


def test_memory_is_not_mutated() -> None:
    tasks = [view(1, 100), view(2, -100, min_share=0.2)]
    first = decide(0.0, tasks)
    before = (dict(first.memory.samples), dict(first.memory.bursts))
    decide(0.3, [view(1, 100), view(2, -100, min_share=0.2, run=0.2)], first.memory)
    assert (first.memory.samples, first.memory.bursts) == before


def test_share_in_window_and_starves_at() -> None:
    samples = ((0.0, 0.0), (0.5, 0.5), (2.0, 0.5))
    assert share_in_window(samples, 2.0) == pytest.approx(0.0)
    assert share_in_window(samples, 1.2) == pytest.approx(0.3)  # [0.2, 0.5] of [0.2, 1.2]
    samples = ((0.0, 0.0), (0.5, 0.5))
    # Without running again, the share over [t - 1, t] drops to 0.2 at t = 1.3.
    assert starves_at(samples, 0.2) == pytest.approx(1.3)
    assert starves_at(((0.0, 0.0),), 0.2) == float("-inf")


def test_samples_stay_bounded_in_a_long_run() -> None:
    tasks = [SimTask(1, priority=100), SimTask(2, priority=-100, min_share=0.2)]
    memory = None

    def remember(snapshot: Snapshot, previous) -> Decision:
        nonlocal memory
        decision = decide_share(snapshot, previous)
        memory = decision.memory
        return decision

    simulate(remember, tasks, duration=60.0)
    assert isinstance(memory, ShareMemory)
    assert len(memory.samples[2]) <= 6


@pytest.mark.parametrize("min_share", [0.05, 0.1, 0.2, 0.5])
def test_simulation_bounded_starvation(min_share: float) -> None:
    tasks = [SimTask(1, priority=100), SimTask(2, priority=-100, min_share=min_share)]
    shares = simulate(decide_share, tasks, duration=20.0).shares()
    assert shares[2] >= 0.9 * min_share
    assert shares[2] <= min_share + 0.05
    assert shares[1] + shares[2] == pytest.approx(1.0)


def test_simulation_low_task_keeps_at_least_18_percent() -> None:
    tasks = [SimTask(1, priority=100), SimTask(2, priority=-100, min_share=0.2)]
    result = simulate(decide_share, tasks, duration=10.0)
    assert result.shares()[2] >= 0.18
    # Bursts, not constant flapping: about one suspension per window each.
    assert result.preemptions[1] <= 11


def test_simulation_two_starved_tasks_each_get_their_share() -> None:
    tasks = [
        SimTask(1, priority=100),
        SimTask(2, priority=-100, min_share=0.2),
        SimTask(3, priority=-50, min_share=0.2),
    ]
    shares = simulate(decide_share, tasks, duration=20.0).shares()
    assert shares[2] >= 0.18
    assert shares[3] >= 0.18
    assert shares[1] >= 0.5


def test_simulation_late_starter_gets_its_share_while_active() -> None:
    tasks = [
        SimTask(1, priority=100),
        SimTask(2, priority=-100, min_share=0.2, active=((3.0, 13.0),)),
    ]
    result = simulate(decide_share, tasks, duration=13.0)
    assert result.run_seconds[2] / 10.0 >= 0.18


def test_simulation_without_min_share_low_task_starves() -> None:
    tasks = [SimTask(1, priority=100), SimTask(2, priority=-100)]
    assert simulate(decide_share, tasks, duration=5.0).run_seconds[2] == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_random_workloads_keep_the_floor_and_strict_priority_otherwise(seed: int) -> None:
    rng = random.Random(seed)
    floor = rng.choice([0.05, 0.1, 0.2, 0.3])
    others = [
        SimTask(
            task_id,
            priority=rng.choice([0, 50, 100]),
            active=tuple((s, s + rng.uniform(0.01, 0.4)) for s in sorted(rng.sample(range(20), 8))),
        )
        for task_id in (2, 3)
    ]
    tasks = [SimTask(1, priority=100), *others, SimTask(4, priority=-100, min_share=floor)]
    result = simulate(decide_share, tasks, duration=20.0)
    assert result.shares()[4] >= 0.9 * floor
    for _, suspended_ids in result.trace:
        # Outside bursts the top task runs; in a burst only task 4 (and nothing above it) runs.
        assert (1 in suspended_ids) != (4 in suspended_ids)
