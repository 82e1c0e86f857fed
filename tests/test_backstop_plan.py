"""The backstop's rules as pure functions: facts in, a frozen plan out (backstop_plan.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpreempt.daemon.backstop_plan import (
    BackstopPlan,
    HoldBaseline,
    HoldFacts,
    HoldLeak,
    next_due,
    plan_backstop,
)


def facts(task_id: int = 1, **fields) -> HoldFacts:
    values = {
        "task_id": task_id,
        "uid": 1000,
        "priority": -100,
        "gpus": (0,),
        "held": False,
        "backed_up": True,
        "gate_held_since": 100.0,
        "held_on_gpu": False,
        "lock_tried": False,
        "counts_launches": False,
        "launches": 0,
        "channels": 1,
        "must_stand_still": True,
        "hold_baseline": None,
        "hold_leaked": False,
    }
    values.update(fields)
    return HoldFacts(**values)


def test_a_task_held_by_its_gate_for_the_delay_is_locked() -> None:
    tasks = [facts()]
    assert plan_backstop(tasks, 100.04, delay_s=0.05, lock=True).locks == ()
    assert plan_backstop(tasks, 100.05, delay_s=0.05, lock=True).locks == (1,)
    assert plan_backstop(tasks, 100.05, delay_s=0.05, lock=False).locks == ()
    assert next_due(tasks, 100.0, delay_s=0.05, lock=True) == pytest.approx(100.05)


def test_a_task_not_held_by_its_gate_or_tried_already_is_left_alone() -> None:
    for fact in (facts(gate_held_since=None), facts(backed_up=False), facts(lock_tried=True)):
        assert plan_backstop([fact], 1e9, delay_s=0.05, lock=True).locks == ()
        assert next_due([fact], 100.0, delay_s=0.05, lock=True) is None


def test_a_lock_the_driver_refuses_is_not_tried_again_signals_take_its_place() -> None:
    refused = facts(lock_refused=True)
    plan = plan_backstop([refused], 100.05, delay_s=0.05, lock=True, signals=True)
    assert plan.locks == () and plan.signals == (1,)
    assert plan_backstop([refused], 100.04, delay_s=0.05, lock=True, signals=True).signals == ()
    assert next_due([refused], 100.0, delay_s=0.05, lock=True, signals=True) == pytest.approx(
        100.05
    )
    # where signals may not be used, nothing backs it up, and nothing is due for it
    assert plan_backstop([refused], 1e9, delay_s=0.05, lock=True) == BackstopPlan((), (), ())
    assert next_due([refused], 100.0, delay_s=0.05, lock=True) is None
    # a leak of it says signals back it up, not the lock
    leaking = facts(lock_refused=True, barrier_leaked=True)
    (leak,) = plan_backstop([leaking], 100.0, delay_s=0.05, lock=True, signals=True).leaks
    assert leak.signals and not leak.locked


def test_a_gate_that_holds_on_the_gpu_is_trusted_only_below_its_own_user() -> None:
    trainer = facts(held_on_gpu=True)
    own_server = facts(2, priority=100, gate_held_since=None)
    other_server = facts(3, uid=1001, priority=100, gate_held_since=None)
    assert plan_backstop([trainer, own_server], 200.0, delay_s=0.05, lock=True).locks == ()
    tasks = [trainer, own_server, other_server]
    assert plan_backstop(tasks, 200.0, delay_s=0.05, lock=True).locks == (1,)
    held_other = dataclasses.replace(other_server, held=True)  # held by hand: outranks none
    assert plan_backstop([trainer, held_other], 200.0, delay_s=0.05, lock=True).locks == ()


def test_a_hold_is_counted_once_settled_and_a_leak_is_locked_at_once() -> None:
    counted = facts(held_on_gpu=True, counts_launches=True, launches=1000)
    early = plan_backstop([counted], 100.1, delay_s=10.0, lock=True)
    assert early == BackstopPlan(baselines=(), leaks=(), locks=())
    settled = plan_backstop([counted], 100.25, delay_s=10.0, lock=True)
    assert settled.baselines == (HoldBaseline(1, 1000),) and settled.locks == ()
    still = dataclasses.replace(
        counted, hold_baseline=HoldBaseline(1, 1000), launches=1016
    )  # within slack
    assert plan_backstop([still], 100.35, delay_s=10.0, lock=True).leaks == ()
    moved = dataclasses.replace(counted, hold_baseline=HoldBaseline(1, 1000), launches=1500)
    leaking = plan_backstop([moved], 100.35, delay_s=10.0, lock=True)
    assert leaking.leaks == (HoldLeak(1, 500, locked=True),) and leaking.locks == (1,)
    nowhere = plan_backstop([moved], 100.35, delay_s=10.0, lock=False)
    assert nowhere.leaks == (HoldLeak(1, 500, locked=False),) and nowhere.locks == ()


def test_a_gate_closed_only_for_watched_tasks_moves_its_baseline() -> None:
    watched = facts(
        counts_launches=True,
        launches=1500,
        hold_baseline=HoldBaseline(1, 1000),
        must_stand_still=False,
    )
    result = plan_backstop([watched], 100.35, delay_s=10.0, lock=True)
    assert result.baselines == (HoldBaseline(1, 1500),) and result.leaks == ()


def test_a_gate_held_on_the_cpu_by_a_watched_task_that_stays_active_must_stand_still() -> None:
    """No barriers (a task at ``high``): while a task it watches stays active, every launch
    waits on the CPU. A baseline taken while so, and the epochs of the watched blocks
    unchanged since, its launches are checked; a watched task that dropped and rose again in
    between (its epoch moved), or a baseline taken while not so, only moves the baseline."""
    watched = {"counts_launches": True, "must_stand_still": False, "watch_held": True}
    first = facts(**watched, launches=1000, watch_epochs=(7,))
    settled = plan_backstop([first], 100.25, delay_s=10.0, lock=True)
    assert settled.baselines == (HoldBaseline(1, 1000, (7,)),)
    went_on = dataclasses.replace(first, hold_baseline=HoldBaseline(1, 1000, (7,)), launches=1500)
    (leak,) = plan_backstop([went_on], 100.35, delay_s=10.0, lock=True).leaks
    assert leak.moved == 500
    rose_again = dataclasses.replace(went_on, watch_epochs=(8,))
    result = plan_backstop([rose_again], 100.35, delay_s=10.0, lock=True)
    assert result.leaks == () and result.baselines == (HoldBaseline(1, 1500, (8,)),)
    dropped = dataclasses.replace(went_on, watch_held=False)
    result = plan_backstop([dropped], 100.35, delay_s=10.0, lock=True)
    assert result.leaks == () and result.baselines == (HoldBaseline(1, 1500, None),)
    not_held_then = dataclasses.replace(went_on, hold_baseline=HoldBaseline(1, 1000))
    assert plan_backstop([not_held_then], 100.35, delay_s=10.0, lock=True).leaks == ()


def test_checks_come_back_every_period_once_counted() -> None:
    counted = facts(backed_up=False, counts_launches=True)
    assert next_due([counted], 100.0, delay_s=0.05, lock=True) == pytest.approx(100.2)
    based = dataclasses.replace(counted, hold_baseline=HoldBaseline(1, 10))
    assert next_due([based], 100.3, delay_s=0.05, lock=True) == pytest.approx(100.4)


def test_work_past_the_barriers_is_a_leak_backed_up_at_once_and_reported_once() -> None:
    passed = facts(held_on_gpu=True, must_stand_still=False, barrier_leaked=True)
    plan = plan_backstop([passed], 100.01, delay_s=10.0, lock=True)
    assert plan.leaks == (HoldLeak(1, 0, locked=True, barrier=True),) and plan.locks == (1,)
    idle = dataclasses.replace(passed, gate_held_since=None)  # found while not preempted
    assert plan_backstop([idle], 100.01, delay_s=10.0, lock=True).leaks == (
        HoldLeak(1, 0, locked=False, barrier=True),
    )
    reported = dataclasses.replace(passed, untrusted=True)
    assert plan_backstop([reported], 100.01, delay_s=10.0, lock=True).leaks == ()
