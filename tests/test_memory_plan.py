"""The memory reserves' rules as pure functions: facts and readings in, steps out
(memory_plan.py)."""

from __future__ import annotations

from gpreempt.daemon.memory_plan import (
    RESTORE_AFTER_S,
    MakeRoom,
    MemoryFacts,
    RestorePlan,
    Victim,
    Waiting,
    candidates,
    plan_restores,
    plan_room,
    reservers,
)

GiB = 1 << 30


def facts(task_id: int, priority: int, **fields) -> MemoryFacts:
    values = {
        "task_id": task_id,
        "name": f"t{task_id}",
        "priority": priority,
        "gpus": (0,),
        "reserve_bytes": 0,
        "active": False,
        "held": False,
        "evicted": False,
    }
    values.update(fields)
    return MemoryFacts(**values)


def test_only_an_active_reserve_not_held_counts() -> None:
    tasks = [
        facts(1, 100, reserve_bytes=GiB, active=True),
        facts(2, 100, reserve_bytes=GiB),
        facts(3, 100, reserve_bytes=GiB, active=True, held=True),
        facts(4, 0, active=True),
    ]
    assert [t.task_id for t in reservers(tasks)] == [1]


def test_room_is_made_lowest_priority_first_then_largest() -> None:
    server = facts(1, 100, reserve_bytes=10 * GiB, active=True)
    tasks = [
        server,
        facts(2, 0),
        facts(3, -100),
        facts(4, -100),
        facts(5, -100, evicted=True),  # on the host already
        facts(6, -100, gpus=(1,)),  # another GPU
        facts(7, -100),  # its eviction failed lately
        facts(8, 200),  # more important
    ]
    found = candidates(server, 0, 2 * GiB, tasks, {7: 50.0}, now=40.0)
    assert [t.task_id for t in found] == [2, 3, 4]
    footprints = {2: 8 * GiB, 3: GiB, 4: 4 * GiB}
    assert plan_room(server, 0, 2 * GiB, found, footprints) == MakeRoom(
        reserver="t1",
        gpu=0,
        need=10 * GiB,
        free=2 * GiB,
        victims=(Victim(4, 4 * GiB), Victim(3, GiB), Victim(2, 8 * GiB)),
    )
    assert plan_room(server, 0, 2 * GiB, found, {**footprints, 3: 0}).victims[1] == Victim(
        2, 8 * GiB
    )


def test_a_reserve_that_fits_evicts_nobody() -> None:
    server = facts(1, 100, reserve_bytes=GiB, active=True)
    assert candidates(server, 0, 2 * GiB, [server, facts(2, 0)], {}, now=0.0) == ()
    assert plan_room(server, 0, 2 * GiB, [], {}) is None


def test_a_task_evicted_for_a_reserve_waits_for_it_to_be_released() -> None:
    waiting = [
        Waiting(3, gpu=0, for_reserve=True),
        Waiting(1, gpu=None, for_reserve=True),  # gone
        Waiting(2, gpu=0, for_reserve=False),  # waits only for room
        Waiting(4, gpu=1, for_reserve=True),
    ]
    active_at = {0: 100.0, 1: 100.0 - RESTORE_AFTER_S}
    assert plan_restores(waiting, active_at, now=100.5) == RestorePlan(restore=(2, 4), forget=(1,))
