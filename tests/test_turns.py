"""Turns among gated peers under a more important task (hpf with turns): the policy as pure
functions, and the daemon with real gated processes (CPU tensors)."""

from __future__ import annotations

import json
import sys
import time

import pytest
from conftest import TORCH_COUNTER, Counter, Daemon, gpreempt, spawn, status, stop_all, wait_for
from conftest import task_view as view

from gpreempt.policy import Decision, Snapshot, decide_hpf
from gpreempt.policy.inflight import inflight_shares
from gpreempt.policy.turns import IDLE_PASS_S, TurnSettings, launch_slots, turn_groups

SETTINGS = TurnSettings(turn_ms=20.0, budget_ms=1.0)
TURN_S = 0.020
PAUSE_S = 0.001  # the whole budget: the group is the GPU's only launch slot


def server(active: bool = False):
    return view(1, 100, active=active, gated=False)


def trainer(task_id: int, active: bool = True, **fields):
    return view(task_id, -100, active=active, gated=True, **fields)


class Clock:
    """Calls hpf with turns again and again, carrying its memory, like the daemon does."""

    def __init__(self) -> None:
        self.memory = None

    def at(self, now: float, *tasks) -> Decision:
        decision = decide_hpf(Snapshot(now=now, tasks=tasks), self.memory, SETTINGS)
        self.memory = decision.memory
        return decision


def test_gated_peers_under_a_registered_server_take_turns_with_the_whole_budget() -> None:
    tasks = (server(), trainer(2), trainer(3), trainer(4))
    decision = Clock().at(10.0, *tasks)
    assert decision.suspend == {3, 4} and decision.turns == {3, 4}
    assert decision.wake_at == pytest.approx(10.0 + TURN_S)
    snapshot = Snapshot(now=10.0, tasks=tasks)
    assert inflight_shares(snapshot, 1.0, turns=True) == pytest.approx({2: 1.0, 3: 1.0, 4: 1.0})
    assert inflight_shares(snapshot, 1.0) == pytest.approx({2: 1 / 3, 3: 1 / 3, 4: 1 / 3})


def test_a_busy_holder_hands_on_after_a_pause_for_its_queue_to_drain() -> None:
    clock = Clock()
    tasks = (server(), trainer(2), trainer(3), trainer(4))
    clock.at(10.0, *tasks)
    end = 10.0 + TURN_S
    handoff = clock.at(end, *tasks)
    assert handoff.suspend == {2, 3, 4}  # nobody launches while 2's queue drains
    assert handoff.wake_at == pytest.approx(end + PAUSE_S)
    after = clock.at(end + PAUSE_S, *tasks)
    assert after.suspend == {2, 4} and after.wake_at == pytest.approx(end + PAUSE_S + TURN_S)
    # then 4, then 2 again: a fixed rotation by task id
    t = end + PAUSE_S + TURN_S
    clock.at(t, *tasks)
    assert clock.at(t + PAUSE_S, *tasks).suspend == {2, 3}
    t += PAUSE_S + TURN_S
    clock.at(t, *tasks)
    assert clock.at(t + PAUSE_S, *tasks).suspend == {3, 4}


def test_a_holder_whose_barriers_hold_its_queue_hands_on_without_a_pause() -> None:
    clock = Clock()
    tasks = (server(), *(trainer(i, barriers=True) for i in (2, 3, 4)))
    clock.at(10.0, *tasks)
    handoff = clock.at(10.0 + TURN_S, *tasks)
    assert handoff.suspend == {2, 4}  # 3 launches at once: a request waits for one barrier
    assert handoff.wake_at == pytest.approx(10.0 + 2 * TURN_S)


def test_an_idle_holder_hands_on_at_once_and_a_round_of_idle_ones_parks_the_group() -> None:
    clock = Clock()
    busy = (server(), trainer(2), trainer(3), trainer(4))
    clock.at(10.0, *busy)
    idle2 = (server(), trainer(2, active=False), trainer(3), trainer(4))
    assert clock.at(10.001, *idle2).suspend == {3, 4}  # too early to call it idle
    passed = clock.at(10.0 + IDLE_PASS_S, *idle2)
    assert passed.suspend == {2, 4}  # no pause: an idle holder has nothing queued
    everyone_idle = (server(), *(trainer(i, active=False) for i in (2, 3, 4)))
    t = 10.0 + IDLE_PASS_S
    wakes = []
    for _ in range(2):
        t += IDLE_PASS_S
        decision = clock.at(t, *everyone_idle)
        wakes.append(decision.wake_at)
    assert decision.suspend == set() and decision.wake_at is None  # parked: all may launch
    assert wakes[0] is not None
    # the first launch rings the daemon: that task takes the turn, the others wait again
    woke = (server(), trainer(2, active=False), trainer(3, active=False), trainer(4))
    assert clock.at(t + 1.0, *woke).suspend == {2, 3}


def test_a_request_suspends_the_whole_group_and_turns_pass_without_a_pause() -> None:
    clock = Clock()
    clock.at(10.0, server(), trainer(2), trainer(3))
    during = clock.at(10.01, server(active=True), trainer(2, active=False), trainer(3))
    assert during.suspend == {2, 3} and during.turns == set()  # preempted, not turn-waiting
    # a holder stopped by the request does not count as idle...
    assert clock.at(10.019, server(active=True), trainer(2, active=False), trainer(3)).suspend
    assert clock.memory[(0, -100, 0)].task_id == 2
    # ...and when its turn runs out meanwhile, the next one may start as soon as it ends
    clock.at(10.0 + TURN_S, server(active=True), trainer(2, active=False), trainer(3))
    after = clock.at(10.021, server(), trainer(2, active=False), trainer(3, active=False))
    assert after.suspend == {2} and after.turns == {2}


def test_a_holder_that_a_long_request_stopped_is_not_taken_for_idle() -> None:
    clock = Clock()
    clock.at(10.0, server(), trainer(2), trainer(3))
    clock.at(10.001, server(active=True), trainer(2), trainer(3))
    # the request lasted: 2's gate has reported it idle meanwhile, though it waits to go on
    ended = clock.at(10.012, server(), trainer(2, active=False), trainer(3, active=False))
    assert ended.suspend == {3}
    assert ended.wake_at == pytest.approx(10.012 + IDLE_PASS_S)
    # it launches at once (its gate rings the daemon) and keeps its turn
    assert clock.at(10.0121, server(), trainer(2), trainer(3, active=False)).suspend == {3}
    assert clock.at(10.0121 + IDLE_PASS_S, server(), trainer(2), trainer(3)).suspend == {3}


def test_who_takes_turns() -> None:
    tasks = (
        server(),
        trainer(2),
        trainer(3),
        view(4, -100, gated=False),  # no gate bounds its queue
        trainer(5, gpus=(0, 1)),  # on two GPUs
        trainer(6, held=True),
        view(7, 0, gated=True),  # alone at its priority
    )
    snapshot = Snapshot(now=0.0, tasks=tasks)
    groups = turn_groups(snapshot)
    assert {k: [t.task_id for t in v] for k, v in groups.items()} == {(0, -100, 0): [2, 3]}
    # the group, 4, 5 and 7 launch side by side on GPU 0; 5 is alone on GPU 1
    assert launch_slots(snapshot, groups) == {0: 4, 1: 0}
    assert launch_slots(snapshot) == {0: 5, 1: 0}
    # the most important task itself never waits, nor do peers with no one above them
    assert turn_groups(Snapshot(now=0.0, tasks=(trainer(2), trainer(3)))) == {}


def test_turns_are_taken_among_tasks_of_one_user_only() -> None:
    # a member's gate words say it waits for its peers' turns; no other user need believe
    # that: another user's trainers run beside the group, each user's own group taking turns
    tasks = (server(), trainer(2), trainer(3), trainer(4, uid=1000), trainer(5, uid=1000))
    snapshot = Snapshot(now=0.0, tasks=tasks)
    groups = {k: [t.task_id for t in v] for k, v in turn_groups(snapshot).items()}
    assert groups == {(0, -100, 0): [2, 3], (0, -100, 1000): [4, 5]}
    assert launch_slots(snapshot, turn_groups(snapshot)) == {0: 2}
    decision = Clock().at(10.0, *tasks)
    assert decision.turns == {3, 5}  # one of each user's group waits, not 4 for 2's turn
    lone = (server(), trainer(2), trainer(4, uid=1000))
    assert turn_groups(Snapshot(now=0.0, tasks=lone)) == {}
    assert Clock().at(10.0, *lone).suspend == set()


def test_a_holder_that_leaves_passes_the_turn_on() -> None:
    clock = Clock()
    clock.at(10.0, server(), trainer(2), trainer(3), trainer(4))
    decision = clock.at(10.005, server(), trainer(3), trainer(4))
    assert decision.suspend == {4}
    assert clock.at(10.006, server(), trainer(4)).suspend == set()  # a lone peer runs freely


def test_without_turns_hpf_is_unchanged() -> None:
    tasks = (server(), trainer(2), trainer(3))
    decision = decide_hpf(Snapshot(now=0.0, tasks=tasks))
    assert decision.suspend == set() and decision.wake_at is None and decision.turns == set()


def test_the_daemon_lets_gated_peers_launch_one_at_a_time(runtime_dir, tmp_path) -> None:
    """Three gated PyTorch loops under a registered `high` task: at any moment at most one
    that is active runs, and each gets turns. (Where all three look idle at once, as a loaded
    two-core machine can stall their loops for longer than the idle grace, the group is
    parked and all may launch: the first to launch then takes the turn.)"""
    pytest.importorskip("torch")
    daemon = Daemon(runtime_dir, "--turn-ms", "50")
    script = tmp_path / "peer.py"
    script.write_text(TORCH_COUNTER)
    procs = [spawn(runtime_dir, "run", "-p", "high", "--name", "srv", "--", "sleep", "120")]
    counters = []
    try:
        for i in range(3):
            progress = tmp_path / f"progress-{i}"
            counters.append(Counter(progress))
            argv = ["run", "-p", "low", "--name", f"peer-{i}", "--"]
            procs.append(spawn(runtime_dir, *argv, sys.executable, str(script), str(progress)))

        def peers() -> list[dict]:
            return [t for t in status(runtime_dir)["tasks"] if t["name"].startswith("peer-")]

        def all_gated() -> bool:
            tasks = peers()
            return len(tasks) == 3 and all((t["gate"] or {}).get("installed") for t in tasks)

        assert wait_for(all_gated, 120), peers()
        # sampled every 20 ms for 2 s: 40 turns of 50 ms, and at least 25 samples
        running, seen = [], []
        end = time.monotonic() + 2.0
        while time.monotonic() < end or len(running) < 25:
            tasks = peers()
            running.append(sum(t["state"] == "running" and t["active"] for t in tasks))
            seen.append([(t["name"], t["state"], t["active"]) for t in tasks])
            # the srv task is not active: whoever is suspended only waits for its turn
            assert all(t["waiting_turn"] == (t["state"] == "suspended") for t in tasks), tasks
            time.sleep(0.02)
        assert max(running) == 1, (running, seen)
        # the srv task never became active: nobody was preempted, every stop was a turn
        assert all(t["preemptions"] == 0 for t in peers())
        assert sum(t["turns"] for t in peers()) >= 2
        shown = gpreempt(runtime_dir, "status").stdout
        assert "peers take 50 ms turns" in shown, shown
        before = [c.value() for c in counters]

        def each_advanced() -> bool:
            return all(c.value() > b for c, b in zip(counters, before, strict=True))

        assert wait_for(each_advanced, 20)
        events = (runtime_dir / "events.jsonl").read_text().splitlines()
        assert any(json.loads(e).get("reason") == "turn" for e in events)
    finally:
        stop_all(*procs, timeout=20)
        daemon.stop()
