"""The backstop where the driver has no lock (CPU machines, AMD): signals back a gate up, and
the kernel's count of a held task's CPU time tells whether its gate holds (a fake clock, a
fake CPU count and fake signals; tests/test_lying_gates.py has the real processes)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from test_backstop import FakeDriver, FakeEvents

from gpreempt.daemon.apply import Executor
from gpreempt.daemon.backstop import Backstop
from gpreempt.daemon.backstop_plan import HOLD_WINDOW_S
from gpreempt.daemon.hold_meter import HoldMeter
from gpreempt.daemon.registry import Registry
from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.daemon.task_state import TaskState, change_state
from gpreempt.mechanisms.cuda_driver import NOT_SUPPORTED

PID = 4242


class FakeMechanism:
    """Records what it was asked: ('stop' | 'cont', pid)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, int]] = []

    def suspend(self, target) -> str:
        self.calls.append(("stop", target.pid))
        return self.name

    def resume(self, target) -> str:
        self.calls.append(("cont", target.pid))
        return self.name


class FakeCpu:
    """CPU time (ns) of each process, as the tests set it."""

    def __init__(self) -> None:
        self.ns: dict[int, int] = {PID: 0}

    def __call__(self, pid: int) -> int | None:
        return self.ns.get(pid)

    def run(self, seconds: float, pid: int = PID) -> None:
        self.ns[pid] += round(seconds * 1e9)


class Block:
    """A control block as the backstop reads it: the words its client wrote."""

    def __init__(self, driver_gate: str = "none", barriers_on: bool = False) -> None:
        self.driver_gate = driver_gate
        self.barriers_on = barriers_on
        self.gate_installed = True
        self.driver_launches = 1000
        self.barrier_leaks = 0
        self.gate_word = 1  # closed outright
        self.hinted = False


def _task(registry: Registry, uid: int, priority: int, pid: int, name: str) -> Task:
    task = Task(
        TaskIdentity(
            task_id=registry.new_id(),
            pid=pid,
            pgid=None,
            start_time=0,
            uid=uid,
            name=name,
            priority=priority,
            gpus=(0,),
            mechanism="auto",
        )
    )
    registry.add(task)
    return task


def setup(block: Block, *, driver: FakeDriver | None = None) -> SimpleNamespace:
    registry, events, cpu = Registry(), FakeEvents(), FakeCpu()
    task = _task(registry, os.getuid(), -100, PID, "trainer")
    task.controls[1] = block
    backstop = Backstop(
        registry,
        events,
        50.0,
        driver=driver,
        lock_available=driver is not None,
        signals=True,
        meter=HoldMeter(cpu_ns=cpu),
    )
    signal, gate = FakeMechanism("signal"), FakeMechanism("gate")
    host = SimpleNamespace(
        registry=registry,
        events=events,
        backstop=backstop,
        mechanisms=SimpleNamespace(get=lambda name: signal, concrete={"gate": gate}),
        record_stops=lambda about_to: True,
        metrics=None,
        log=lambda message: None,
    )
    return SimpleNamespace(
        registry=registry,
        events=events,
        task=task,
        cpu=cpu,
        backstop=backstop,
        signals=signal.calls,
        executor=Executor(host),  # type: ignore[arg-type]
    )


def server(world: SimpleNamespace, uid: int) -> Task:
    return _task(world.registry, uid, 100, 4343, "server")


def apply(world: SimpleNamespace, now: float) -> None:
    """One pass of the backstop: its plan, carried out by the daemon's executor."""
    world.executor.apply_backstop(world.backstop.plan(now))


def hold(world: SimpleNamespace, at: float, state: TaskState = TaskState.SUSPENDED) -> None:
    change_state(world.task, state, now=at, mechanism="gate")
    apply(world, at)


def test_below_another_users_task_a_gate_claim_is_backed_by_signals_after_the_delay() -> None:
    # no driver lock here: signals take its place, for the same tasks and after the same delay
    world = setup(Block(barriers_on=True))
    server(world, uid=world.task.uid)
    hold(world, 100.0)
    apply(world, 100.2)
    assert world.signals == []  # its own user's task: its words are its own business
    server(world, uid=world.task.uid + 1)
    assert world.backstop.next_due(100.2) == 100.05  # due since the delay passed
    apply(world, 100.2)
    assert world.signals == [("stop", PID)] and world.task.backstop_signalled
    assert world.events.records[-1]["event"] == "backstop"
    assert world.events.records[-1]["mechanism"] == "signal"
    world.executor.resume(world.task, reason="policy")  # continued before its gate opens
    assert world.signals[-1] == ("cont", PID) and not world.task.backstop_signalled


def test_a_barriers_gate_whose_launches_go_on_is_stopped_with_signals() -> None:
    world = setup(Block("on", barriers_on=True))
    server(world, uid=world.task.uid)
    hold(world, 100.0)
    apply(world, 100.25)
    world.task.controls[1].driver_launches += 500
    apply(world, 100.35)
    assert world.task.hold_leaked and world.signals == [("stop", PID)]
    reason = next(r for r in world.events.records if r["event"] == "error")["reason"]
    assert "500 launches" in reason and "signals" in reason


def test_a_failed_lock_falls_back_to_signals() -> None:
    world = setup(Block(), driver=FakeDriver(fail=True))
    hold(world, 100.0)
    apply(world, 100.05)
    world.backstop.finish()
    assert "backstop lock failed" in world.events.records[-1]["reason"]
    apply(world, 100.06)  # the pass after the lock's outcome came in
    assert world.signals == [("stop", PID)] and world.task.backstop_signalled
    assert world.events.records[-1]["reason"] == "its driver lock failed"


def test_a_lock_the_driver_refuses_is_tried_once_then_signals_stand_in_for_it() -> None:
    # a process with a tools library loaded (the driver-level gate's): CUDA_ERROR_NOT_SUPPORTED
    driver = FakeDriver(fail=True, code=NOT_SUPPORTED)
    world = setup(Block(), driver=driver)
    hold(world, 100.0)
    apply(world, 100.05)
    world.backstop.finish()
    assert "not tried again on this task" in world.events.records[-1]["reason"]
    apply(world, 100.06)
    assert world.signals == [("stop", PID)]
    errors = len([r for r in world.events.records if r["event"] == "error"])
    for start in (200.0, 300.0):  # later suspensions: signals once due, no lock tried
        world.backstop.release(world.task)
        change_state(world.task, TaskState.RUNNING, now=start - 1.0)
        world.task.backstop_signalled = False
        stops = len(world.signals)
        hold(world, start)
        apply(world, start + 0.04)
        assert len(world.signals) == stops  # not before the lock's delay
        apply(world, start + 0.05)
        world.backstop.finish()
        assert len(world.signals) == stops + 1
    assert world.signals == [("stop", PID)] * 3
    assert driver.calls == [("failed lock", PID)]
    assert len([r for r in world.events.records if r["event"] == "error"]) == errors
    assert world.events.records[-1]["reason"] == "the driver refuses to lock it"


def _run_held(world: SimpleNamespace, start: float, seconds: float, cpu_share: float) -> float:
    """Passes every 0.1 s of a hold while its process runs ``cpu_share`` of the time."""
    now = start
    while now < start + seconds - 1e-9:
        world.cpu.run(0.1 * cpu_share)
        now += 0.1
        apply(world, now)
    return now


def test_a_gate_claim_whose_process_runs_on_is_found_by_its_cpu_time() -> None:
    world = setup(Block())  # it says a gate holds it (gate_installed), nothing else
    server(world, uid=world.task.uid)
    hold(world, 100.0)
    _run_held(world, 100.0, HOLD_WINDOW_S + 0.1, cpu_share=1.0)
    assert world.task.hold_leaked and world.task.counters.hold_leaks == 1
    assert world.signals == [("stop", PID)]
    assert world.task.gate_untrusted and not world.task.gated
    reason = next(r for r in world.events.records if r["event"] == "error")["reason"]
    assert "CPU" in reason
    # its next suspension is backed up at once: its gate's words no longer count
    world.executor.resume(world.task, reason="policy")
    hold(world, 102.0)
    assert world.signals[-1] == ("stop", PID)


def test_a_gate_that_holds_its_process_still_is_left_alone() -> None:
    world = setup(Block())
    server(world, uid=world.task.uid)
    hold(world, 100.0)
    _run_held(world, 100.0, 5.0, cpu_share=0.05)  # its other threads run a little
    assert not world.task.hold_leaked and world.signals == []
    assert not world.task.gate_untrusted


@pytest.mark.parametrize(
    "block", [Block(barriers_on=True), Block("on")], ids=["operator", "driver"]
)
def test_the_cpu_time_of_a_gate_with_barriers_proves_nothing(block: Block) -> None:
    # its work waits on the GPU, and a thread waiting for it may spin on the CPU
    world = setup(block)
    server(world, uid=world.task.uid)
    hold(world, 100.0)
    _run_held(world, 100.0, 2.0, cpu_share=1.0)
    assert not world.task.hold_leaked and world.signals == []


def test_a_gate_closed_only_while_watched_tasks_are_active_is_not_counted() -> None:
    # word 2V: each held thread polls the watched words every 30 us, which costs a core a
    # fifth of its time or more; such a word is written only below tasks of its own user
    block = Block()
    block.gate_word = 2
    world = setup(block)
    server(world, uid=world.task.uid)
    hold(world, 100.0)
    _run_held(world, 100.0, 2.0, cpu_share=1.0)
    assert not world.task.hold_leaked and world.signals == []


def _turns(world: SimpleNamespace, rounds: int, cpu_while_waiting: float) -> float:
    """Waits of 20 ms for a peer's turn, each followed by its own turn of 20 ms."""
    now = 100.0
    for _ in range(rounds):
        hold(world, now, TaskState.WAITING_TURN)
        world.cpu.run(cpu_while_waiting)
        world.backstop.release(world.task, now=now + 0.02)
        change_state(world.task, TaskState.RUNNING, now=now + 0.02)
        world.cpu.run(0.02)
        now += 0.04
    apply(world, now)
    return now


def test_a_peer_that_runs_through_its_turn_waits_is_no_longer_trusted_to_take_turns() -> None:
    world = setup(Block())
    server(world, uid=world.task.uid)
    now = _turns(world, 30, cpu_while_waiting=0.02)
    assert world.task.gate_untrusted and world.task.counters.hold_leaks == 1
    assert world.signals == []  # nothing to stop: it leaves the turns, and runs
    assert not world.task.view(now).gated


def test_a_peer_that_waits_for_its_turns_stays_trusted() -> None:
    world = setup(Block())
    server(world, uid=world.task.uid)
    _turns(world, 100, cpu_while_waiting=0.001)  # the rest of its last operator
    assert not world.task.gate_untrusted and world.task.counters.hold_leaks == 0
