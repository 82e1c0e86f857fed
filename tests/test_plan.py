"""The daemon's scheduling plan as a pure function: a snapshot and a decision in, a frozen
value out (daemon/plan.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpreempt.daemon.plan import (
    MAX_WATCH_VERSION,
    PeerFacts,
    Plan,
    PlanSettings,
    Suspension,
    TaskFacts,
    WaitFor,
    WatchList,
    next_watch_version,
    plan,
)
from gpreempt.names import MechanismName
from gpreempt.policy import Decision, Snapshot, TaskView, decide_hpf

SETTINGS = PlanSettings(
    inflight_budget_ms=1.0, turns=False, sleep_after_s=30.0, watch=True, watch_resume=True
)


def facts(task_id: int, priority: int, **fields) -> TaskFacts:
    values = {
        "task_id": task_id,
        "priority": priority,
        "uid": 1000,
        "suspended": False,
        "held": False,
        "waiting_turn": False,
        "evicted": False,
        "unprotected": False,
        "closes_gate": True,
        "backed_up": False,
        "always_active": False,
        "controls": (task_id,),
        "window_share_ms": None,
        "sleep_ok": False,
    }
    values.update(fields)
    return TaskFacts(**values)


def peer(task_id: int, **fields) -> PeerFacts:
    values = {
        "conn_id": task_id,
        "channel_task": task_id,
        "channel_ready": True,
        "watching": (),
        "watch_version": 0,
    }
    values.update(fields)
    return PeerFacts(**values)


def snapshot_of(tasks: list[TaskFacts], active: set[int], now: float = 100.0) -> Snapshot:
    return Snapshot(
        now=now,
        tasks=tuple(
            TaskView(
                t.task_id,
                t.priority,
                (0,),
                active=t.task_id in active,
                suspended=t.suspended,
                held=t.held,
                gated=True,
                idle_s=0.0 if t.task_id in active else float("inf"),
            )
            for t in tasks
        ),
    )


def test_a_server_starting_suspends_the_trainers_least_important_first() -> None:
    tasks = [facts(1, 100), facts(2, 0), facts(3, -100)]
    snapshot = snapshot_of(tasks, active={1})
    result = plan(snapshot, decide_hpf(snapshot), tasks, [peer(t.task_id) for t in tasks], SETTINGS)
    assert result.suspend == (Suspension(3, turn=False), Suspension(2, turn=False))
    assert result.resume == () and result.protected_again == ()
    # both share the GPU's budget; the server has no limit from the daemon
    assert dict(result.window_shares) == {2: 0.5, 3: 0.5}
    # each trainer watches the tasks above it, and may go on by itself once they are idle
    assert result.watches == (
        WatchList(conn_id=2, version=1, blocks=((1, 1),)),
        WatchList(conn_id=3, version=1, blocks=((1, 1), (2, 2))),
    )
    # both wait only for the server, which each of them watches
    assert result.releases == {(2, 2): 1, (3, 3): 1}
    assert result.wake_at is None


def test_the_plan_is_a_frozen_value() -> None:
    tasks = [facts(1, 0)]
    snapshot = snapshot_of(tasks, active=set())
    result = plan(snapshot, decide_hpf(snapshot), tasks, [], SETTINGS)
    assert isinstance(result, Plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.suspend = ()  # type: ignore[misc]


def test_a_server_going_idle_resumes_what_it_suspended_but_not_the_evicted_or_held() -> None:
    tasks = [
        facts(1, 100),
        facts(2, 0, suspended=True),
        facts(3, -100, suspended=True, evicted=True),
        facts(4, -100, suspended=True, held=True),
        facts(5, -100, unprotected=True),
    ]
    snapshot = snapshot_of(tasks, active=set())
    result = plan(snapshot, decide_hpf(snapshot), tasks, [], SETTINGS)
    assert result.suspend == ()
    assert result.resume == (2,)
    assert result.protected_again == (5,)


def test_a_held_task_is_suspended_whatever_the_policy_says_and_never_for_a_turn() -> None:
    tasks = [facts(1, 0, held=True), facts(2, 0)]
    snapshot = snapshot_of(tasks, active=set())
    decision = Decision(suspend=frozenset({2}), turns=frozenset({1, 2}))
    result = plan(snapshot, decision, tasks, [], SETTINGS)
    assert result.suspend == (Suspension(1, turn=False), Suspension(2, turn=True))


def test_a_suspended_task_whose_reason_to_wait_changed_is_told_so() -> None:
    tasks = [
        facts(1, 0, suspended=True, waiting_turn=True, held=True),  # held: not for a turn
        facts(2, 0, suspended=True),  # now only its turn
        facts(3, 0, suspended=True, waiting_turn=True),  # still its turn
        facts(4, 0, suspended=True, evicted=True),  # evicted: it waits for its restore
    ]
    snapshot = snapshot_of(tasks, active=set())
    decision = Decision(suspend=frozenset({2, 3, 4}), turns=frozenset({1, 2, 3, 4}))
    result = plan(snapshot, decision, tasks, [], SETTINGS)
    assert result.wait_changes == (WaitFor(1, turn=False), WaitFor(2, turn=True))
    assert result.suspend == () and result.resume == ()


def test_the_plan_says_what_suspends_a_task_whose_own_mechanism_fails() -> None:
    tasks = [facts(1, 100), facts(2, 0, backed_up=True), facts(3, -100)]
    snapshot = snapshot_of(tasks, active={1})
    result = plan(snapshot, decide_hpf(snapshot), tasks, [], SETTINGS)
    assert result.suspend == (
        Suspension(3, turn=False, fallback=None),
        Suspension(2, turn=False, fallback=MechanismName.SIGNAL),
    )


def test_only_changes_are_planned_for_shares_sleep_and_watch_lists() -> None:
    tasks = [facts(1, 100), facts(2, 0, window_share_ms=1.0)]
    snapshot = snapshot_of(tasks, active=set())
    watched = peer(2, watching=((1, 1),), watch_version=7)
    result = plan(snapshot, decide_hpf(snapshot), tasks, [peer(1), watched], SETTINGS)
    assert result.window_shares == ()  # already told 1.0 ms
    assert result.sleep == ((2, True),)  # nothing above it was ever active
    assert result.watches == ()  # the same list as it has
    later = plan(snapshot, decide_hpf(snapshot), tasks, [peer(1), watched], SETTINGS, watches=False)
    assert later.watches is None  # not worked out at all


def test_sleep_is_due_when_the_task_above_has_been_idle_long_enough() -> None:
    tasks = [facts(1, 100), facts(2, 0)]
    views = (
        TaskView(1, 100, (0,), active=False, idle_s=10.0),
        TaskView(2, 0, (0,), active=False, gated=True),
    )
    snapshot = Snapshot(now=100.0, tasks=views)
    result = plan(snapshot, decide_hpf(snapshot), tasks, [], SETTINGS)
    assert result.sleep == ()
    assert result.wake_at == pytest.approx(120.0)  # 30 s after the server's last activity


def test_a_gate_that_does_not_see_every_block_of_what_it_waits_for_stays_plainly_closed() -> None:
    # the server has two blocks (two connections); the trainer watches only one of them
    tasks = [facts(1, 100, controls=(1, 9)), facts(2, 0, suspended=True)]
    snapshot = snapshot_of(tasks, active={1})
    partial = peer(2, watching=((1, 1),), watch_version=3)
    result = plan(snapshot, decide_hpf(snapshot), tasks, [partial], SETTINGS, watches=False)
    assert result.releases == {}
    full = peer(2, watching=((1, 1), (1, 9)), watch_version=3)
    result = plan(snapshot, decide_hpf(snapshot), tasks, [full], SETTINGS, watches=False)
    assert result.releases == {(2, 2): 3}
    # an always-active server has no word a gate could watch
    tasks[0] = facts(1, 100, controls=(1, 9), always_active=True)
    result = plan(snapshot, decide_hpf(snapshot), tasks, [full], SETTINGS, watches=False)
    assert result.releases == {}


def test_another_users_tasks_are_never_in_a_watch_list() -> None:
    tasks = [facts(1, 100, uid=0), facts(2, 0)]
    snapshot = snapshot_of(tasks, active=set())
    result = plan(snapshot, decide_hpf(snapshot), tasks, [peer(1), peer(2)], SETTINGS)
    assert result.watches == ()


def test_watch_list_versions_wrap_and_never_reach_zero() -> None:
    assert next_watch_version(0) == 1
    assert next_watch_version(5) == 6
    assert next_watch_version(MAX_WATCH_VERSION) == 1


def test_a_task_is_quiet_only_while_every_task_it_outranks_holds_itself_on_its_words() -> None:
    holding = {"holds_itself": True}
    tasks = [facts(1, 100, controls=(1, 9)), facts(2, 0, **holding), facts(3, -100, **holding)]
    snapshot = snapshot_of(tasks, active=set())
    full = [
        peer(2, watching=((1, 1), (1, 9)), watch_version=4),
        peer(3, watching=((1, 1), (1, 9), (2, 2)), watch_version=2),
    ]
    result = plan(snapshot, decide_hpf(snapshot), tasks, full, SETTINGS, watches=False)
    assert dict(result.quiet) == {1: True, 2: True, 3: True}
    # told once: only changes are planned
    told = [dataclasses.replace(t, quiet=True) for t in tasks]
    assert plan(snapshot, decide_hpf(snapshot), told, full, SETTINGS, watches=False).quiet == ()
    # one trainer's gate reads only one of the server's two blocks: the server rings at once
    partial = [peer(2, watching=((1, 1),), watch_version=4), full[1]]
    result = plan(snapshot, decide_hpf(snapshot), told, partial, SETTINGS, watches=False)
    assert result.quiet == ((1, False),)
    # a connection sent no list yet (version 0) reads none of the words
    unsent = [peer(2, watching=((1, 1), (1, 9)), watch_version=0), full[1]]
    result = plan(snapshot, decide_hpf(snapshot), told, unsent, SETTINGS, watches=False)
    assert result.quiet == ((1, False),)


@pytest.mark.parametrize(
    "low",
    [
        {"holds_itself": False},  # its gate does not hold its queue by itself (the lock backs it)
        {"holds_itself": True, "closes_gate": False},  # a mechanism that never reads the words
        {"holds_itself": True, "uid": 0},  # another user's: it never watches this one
    ],
    ids=["not-self-held", "no-gate", "another-user"],
)
def test_a_task_below_that_needs_the_daemon_keeps_the_raises_ringing(low) -> None:
    tasks = [facts(1, 100), facts(2, 0, **low)]
    snapshot = snapshot_of(tasks, active=set())
    watching = [peer(2, watching=((1, 1),), watch_version=1)]
    result = plan(snapshot, decide_hpf(snapshot), tasks, watching, SETTINGS, watches=False)
    assert 1 not in {task for task, quiet in result.quiet if quiet}


def test_held_tasks_below_need_no_ring_and_no_policy_but_hpf_is_ever_quiet() -> None:
    tasks = [facts(1, 100), facts(2, 0, held=True, suspended=True)]
    snapshot = snapshot_of(tasks, active=set())
    result = plan(snapshot, decide_hpf(snapshot), tasks, [peer(2)], SETTINGS, watches=False)
    assert dict(result.quiet)[1] is True
    no_watch = dataclasses.replace(SETTINGS, watch=False, watch_resume=False)
    result = plan(snapshot, decide_hpf(snapshot), tasks, [peer(2)], no_watch, watches=False)
    assert result.quiet == ()
