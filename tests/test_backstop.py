"""The driver lock behind the gate (mechanism auto), with a fake driver."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

from gpreempt.daemon.apply import Executor
from gpreempt.daemon.backstop import Backstop
from gpreempt.daemon.registry import Registry
from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.daemon.task_state import TaskState, change_state
from gpreempt.mechanisms.cuda_driver import CudaDriverError, ProcessState


class FakeDriver:
    """``fail``: every lock fails, with the CUresult ``code`` (CUDA_ERROR_UNKNOWN unless
    said)."""

    def __init__(
        self, release: threading.Event | None = None, fail: bool = False, code: int = 999
    ) -> None:
        self.states: dict[int, ProcessState] = {}
        self.calls: list[tuple[str, int]] = []
        self.release = release
        self.fail = fail
        self.code = code

    def state(self, pid: int) -> ProcessState:
        return self.states.get(pid, ProcessState.RUNNING)

    def lock(self, pid: int, timeout_ms: int) -> None:
        if self.release is not None:
            self.release.wait(5)
        if self.fail:
            self.calls.append(("failed lock", pid))
            raise CudaDriverError("cuCheckpointProcessLock", pid, self.code)
        self.calls.append(("lock", pid))
        self.states[pid] = ProcessState.LOCKED

    def unlock(self, pid: int) -> None:
        self.calls.append(("unlock", pid))
        self.states[pid] = ProcessState.RUNNING


class FakeEvents:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def write(self, event: str, **fields) -> None:
        self.records.append({"event": event, **fields})


def apply(backstop: Backstop, now: float) -> None:
    """One pass of the backstop: its plan, carried out by the daemon's executor."""
    host = SimpleNamespace(
        registry=backstop.registry,
        events=backstop.events,
        backstop=backstop,
        record_stops=lambda about_to: True,
    )
    Executor(host).apply_backstop(backstop.plan(now))  # type: ignore[arg-type]


def setup(
    driver: FakeDriver, delay_ms: float = 50.0, mechanism: str = "auto", priority: int = -100
):
    daemon = SimpleNamespace(
        registry=Registry(),
        events=FakeEvents(),
        mechanisms=SimpleNamespace(lock_unavailable=None),
    )
    task = Task(
        TaskIdentity(
            task_id=daemon.registry.new_id(),
            pid=4242,
            pgid=None,
            start_time=0,
            uid=os.getuid(),
            name="trainer",
            priority=priority,
            gpus=(0,),
            mechanism=mechanism,
        )
    )
    daemon.registry.add(task)
    change_state(task, TaskState.SUSPENDED, now=100.0, mechanism="gate")
    return daemon, task, Backstop(daemon.registry, daemon.events, delay_ms, driver=driver)


def test_a_task_waiting_only_for_its_turn_is_not_locked() -> None:
    driver = FakeDriver()
    _daemon, task, backstop = setup(driver)
    # closed for a peer's turn, not for a more important task
    change_state(task, TaskState.WAITING_TURN, now=120.0)
    assert backstop.next_due() is None
    apply(backstop, 200.0)
    backstop.finish()
    assert driver.calls == [] and not task.backstop_locked
    change_state(task, TaskState.SUSPENDED, now=150.0)  # then a more important task started
    assert backstop.next_due() == 150.05


def test_locks_after_the_delay_and_unlocks_before_resuming() -> None:
    driver = FakeDriver()
    daemon, task, backstop = setup(driver)
    assert backstop.next_due() == 100.05
    apply(backstop, 100.04)
    backstop.finish()
    assert driver.calls == [] and not task.backstop_locked
    apply(backstop, 100.05)
    backstop.finish()
    assert driver.calls == [("lock", 4242)] and task.backstop_locked
    assert daemon.events.records[-1]["event"] == "backstop"
    assert backstop.next_due() is None  # locked already
    backstop.release(task)
    assert driver.calls[-1] == ("unlock", 4242) and not task.backstop_locked


def test_a_task_resumed_while_its_lock_is_taken_is_unlocked_when_it_is() -> None:
    gate = threading.Event()
    driver = FakeDriver(release=gate)
    _daemon, task, backstop = setup(driver)
    apply(backstop, 200.0)
    change_state(task, TaskState.RUNNING, now=200.0)
    backstop.release(task)  # the lock call is still waiting
    gate.set()
    backstop.finish()
    assert driver.calls == [("lock", 4242), ("unlock", 4242)]
    assert not task.backstop_locked
    assert driver.state(4242) == ProcessState.RUNNING


def test_only_auto_tasks_held_by_their_gate_qualify() -> None:
    for mechanism, used in (("gate", "gate"), ("auto", "signal"), ("auto", "lock")):
        driver = FakeDriver()
        _daemon, task, backstop = setup(driver, mechanism=mechanism)
        change_state(task, TaskState.RUNNING, now=100.0)
        change_state(task, TaskState.SUSPENDED, now=100.0, mechanism=used)
        assert backstop.next_due() is None
        apply(backstop, 1e9)
        backstop.finish()
        assert driver.calls == []


def test_zero_delay_or_no_driver_turns_it_off() -> None:
    _daemon, _task, backstop = setup(FakeDriver(), delay_ms=0)
    assert backstop.next_due() is None
    daemon, _task, _ = setup(FakeDriver())
    no_libcuda = Backstop(daemon.registry, daemon.events, 50.0, lock_available=False)
    assert no_libcuda.next_due() is None


def test_a_failed_lock_is_reported_and_not_retried_until_the_task_resumes() -> None:
    driver = FakeDriver(fail=True)
    daemon, task, backstop = setup(driver)
    apply(backstop, 200.0)
    backstop.finish()
    assert not task.backstop_locked
    assert daemon.events.records[-1]["event"] == "error"
    assert "backstop lock failed" in daemon.events.records[-1]["reason"]
    assert backstop.next_due() is None
    backstop.release(task)  # resumed: the next suspension may try again
    assert backstop.next_due() == 100.05


def test_a_gate_whose_barriers_hold_its_work_is_not_locked() -> None:
    from gpreempt.control import OFF_BARRIERS_ON
    from gpreempt.control_block import ControlBlock

    driver = FakeDriver()
    _daemon, task, backstop = setup(driver)
    control = ControlBlock.create()
    try:
        task.controls[1] = control
        control._set32(OFF_BARRIERS_ON, 1)  # what the native gate writes when it puts barriers
        assert backstop.next_due() is None
        apply(backstop, 200.0)
        backstop.finish()
        assert driver.calls == [] and not task.backstop_locked
        control._set32(OFF_BARRIERS_ON, 0)  # barriers failed or off: the lock backs it up again
        assert backstop.next_due() == 100.05
    finally:
        control.close()


class _Block:
    """A control block as the backstop reads it: its gate's words."""

    def __init__(self, driver_gate: str = "on", barriers_on: bool = False) -> None:
        self.driver_gate = driver_gate
        self.barriers_on = barriers_on
        self.driver_launches = 1000
        self.gate_word = 1  # closed outright
        self.barrier_leaks = 0
        self.driver_asleep = False  # its callbacks on

    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(driver_asleep=self.driver_asleep, driver_paced=False)


def test_a_task_whose_driver_gate_holds_is_not_locked() -> None:
    driver = FakeDriver()
    _daemon, task, backstop = setup(driver)
    task.controls[1] = _Block("on")
    apply(backstop, 200.0)
    backstop.finish()
    assert driver.calls == [] and task.held_on_gpu


def test_a_released_driver_gate_is_backed_by_the_lock() -> None:
    # a profiler took CUPTI: the operator gate's barriers alone do not hold CuPy or Triton work
    driver = FakeDriver()
    _daemon, task, backstop = setup(driver)
    task.controls[1] = _Block("released", barriers_on=True)
    apply(backstop, 200.0)
    backstop.finish()
    assert driver.calls == [("lock", 4242)] and not task.held_on_gpu


def test_work_going_on_behind_a_closed_gate_is_found_and_locked() -> None:
    driver = FakeDriver()
    daemon, task, backstop = setup(driver)
    block = _Block("on")
    task.controls[1] = block
    apply(backstop, 100.25)  # held 250 ms: the launches now must stand still
    assert task.hold_baseline is not None and task.hold_baseline.launches == 1000
    block.driver_launches += 3  # a launch per thread it holds: no leak
    apply(backstop, 100.35)
    assert not task.hold_leaked and driver.calls == []
    block.driver_launches += 500  # its work goes on
    apply(backstop, 100.45)
    backstop.finish()
    assert task.hold_leaked and task.counters.hold_leaks == 1
    assert driver.calls == [("lock", 4242)]
    errors = [r for r in daemon.events.records if r["event"] == "error"]
    assert errors and "does not hold" in errors[0]["reason"]
    backstop.release(task)
    assert not task.hold_leaked and task.hold_baseline is None


def test_holds_are_checked_even_where_the_driver_has_no_lock() -> None:
    daemon, task, backstop = setup(FakeDriver(), delay_ms=0.0)
    block = _Block("on")
    task.controls[1] = block
    assert backstop.next_due(100.0) == 100.2
    apply(backstop, 100.2)
    block.driver_launches += 100
    apply(backstop, 100.3)
    assert task.hold_leaked
    assert "no driver lock" in daemon.events.records[-1]["reason"]


def test_a_gate_closed_for_watched_tasks_is_not_counted() -> None:
    # closed only while the tasks it watches are active (word 2V): it goes on by itself once
    # they are idle, and while they are, its barriers hold on the GPU what it queues
    daemon, task, backstop = setup(FakeDriver())
    block = _Block("on")
    block.gate_word = 2
    task.controls[1] = block
    apply(backstop, 100.25)
    block.driver_launches += 500  # the server is idle: the trainer runs
    apply(backstop, 100.35)
    assert not task.hold_leaked and _baseline(task) == (1500, None)


def _server(daemon, uid: int) -> Task:
    server = Task(
        TaskIdentity(
            task_id=daemon.registry.new_id(),
            pid=4343,
            pgid=None,
            start_time=0,
            uid=uid,
            name="server",
            priority=100,
            gpus=(0,),
            mechanism="auto",
        )
    )
    daemon.registry.add(server)
    return server


def test_a_claim_of_barriers_spares_the_lock_only_before_the_own_user() -> None:
    # what a client writes in its block may only hurt its own user: a task that says its
    # barriers hold is trusted while its own user's server outranks it, not another user's
    driver = FakeDriver()
    daemon, task, backstop = setup(driver)
    task.controls[1] = _Block("none", barriers_on=True)
    _server(daemon, uid=task.uid)
    apply(backstop, 200.0)
    backstop.finish()
    assert driver.calls == []
    _server(daemon, uid=task.uid + 1)  # now another user's server shares its GPU
    apply(backstop, 201.0)
    backstop.finish()
    assert driver.calls == [("lock", 4242)]


def test_a_task_nvml_sees_on_the_sms_once_held_is_a_leak_and_locked() -> None:
    import time

    from gpreempt.control_block import ControlBlock
    from gpreempt.daemon.gpu_busy import GpuBusy

    driver = FakeDriver()
    daemon, task, _ = setup(driver)
    block = ControlBlock.create()
    try:
        block.set_gate(True)  # closed outright
        task.controls = {1: block}
        seen = GpuBusy(clock=time.time)
        backstop = Backstop(daemon.registry, daemon.events, 50.0, driver=driver, gpu_busy=seen)
        now = time.monotonic()
        change_state(task, TaskState.RUNNING, now=now - 5.0)
        change_state(task, TaskState.SUSPENDED, now=now - 2.0, mechanism="gate")
        apply(backstop, now)
        backstop.finish()
        assert not task.hold_leaked  # NVML saw nothing of it
        seen.read(SimpleNamespace(sm_busy=lambda gpu, since: {4242: time.time()}), [0], 0.0)
        apply(backstop, now + 0.1)
        backstop.finish()
        assert task.hold_leaked and task.backstop_locked
        leak = next(r for r in daemon.events.records if "does not hold" in r.get("reason", ""))
        assert "NVML" in leak["reason"]
    finally:
        block.close()


def test_a_task_whose_gpu_work_passed_its_barriers_is_a_leak_and_locked() -> None:
    # the driver-level gate counts a barrier passed while a watched task stayed active
    # (driver_verify.cpp): its barriers do not hold, and its gate is trusted no more
    driver = FakeDriver()
    daemon, task, backstop = setup(driver)
    block = _Block("on", barriers_on=True)
    block.gate_word = 2  # closed only while its watched tasks are active
    task.controls[1] = block
    _server(daemon, uid=task.uid)
    apply(backstop, 200.0)
    backstop.finish()
    assert driver.calls == [] and not task.hold_leaked
    block.barrier_leaks = 1
    apply(backstop, 200.1)
    backstop.finish()
    assert task.hold_leaked and task.gate_untrusted and driver.calls == [("lock", 4242)]
    leak = next(r for r in daemon.events.records if "does not hold" in r.get("reason", ""))
    assert "stream barriers" in leak["reason"]


class _Watched(_Block):
    """A watched task's block as the backstop reads it: its activity, live, and its epoch."""

    def __init__(self) -> None:
        super().__init__("on")
        self.gate_word = 0
        self.active = True
        self.activity_epoch = 7

    def is_active(self) -> bool:
        return self.active


def _held_by_a_watched_task(priority: int):
    """A task at ``priority`` whose gate is closed only while the task it watches (another,
    registered with a block) is active."""
    daemon, task, _ = setup(FakeDriver(), priority=priority)
    block = _Block("on")
    block.gate_word = 2
    task.controls[1] = block
    server = Task(
        TaskIdentity(
            daemon.registry.new_id(), 5151, None, 0, os.getuid(), "server", 200, (0,), "auto"
        )
    )
    daemon.registry.add(server)
    watched = _Watched()
    server.controls[9] = watched
    lists = {1: ((server.task_id, 9),)}  # the watch list of the trainer's connection, 1
    backstop = Backstop(
        daemon.registry,
        daemon.events,
        50.0,
        driver=FakeDriver(),
        watching=lambda conn: lists.get(conn, ()),
    )
    return daemon, task, backstop, block, watched


def test_a_task_at_high_held_by_a_watched_task_that_stays_active_must_stand_still() -> None:
    """No barriers at ``high``: every launch waits on the CPU while the watched task is
    active, so launches counted meanwhile are a leak; the watched task's epoch tells that it
    stayed active between the two looks."""
    _daemon, task, backstop, block, watched = _held_by_a_watched_task(100)
    apply(backstop, 100.25)
    assert _baseline(task) == (1000, (7,))
    block.driver_launches += 500  # its launches went on while the server stayed active
    apply(backstop, 100.35)
    backstop.finish()
    assert task.hold_leaked


def _baseline(task: Task) -> tuple[int, tuple[int, ...] | None]:
    """The launches and watched epochs the backstop counts ``task``'s hold from."""
    assert task.hold_baseline is not None, "no baseline taken"
    return task.hold_baseline.launches, task.hold_baseline.epochs


def test_a_watched_task_that_dropped_between_two_looks_only_moves_the_baseline() -> None:
    _daemon, task, backstop, block, watched = _held_by_a_watched_task(100)
    block.driver_asleep = True  # its gate wakes (subscribes again) before its launches wait
    apply(backstop, 100.25)
    assert _baseline(task)[1] is None
    block.driver_asleep = False
    apply(backstop, 100.3)
    watched.activity_epoch += 1  # it dropped (the gate went on) and rose again
    block.driver_launches += 500
    apply(backstop, 100.35)
    assert not task.hold_leaked and _baseline(task) == (1500, (8,))
    watched.active = False  # it dropped: the gate goes on by itself
    block.driver_launches += 500
    apply(backstop, 100.45)
    assert not task.hold_leaked and _baseline(task) == (2000, None)


def test_a_trainer_whose_driver_gate_may_put_barriers_is_not_held_by_watch() -> None:
    """Below ``high`` its driver-level gate may hold its queue on the GPU behind barriers,
    the CPU queueing on: its launches prove nothing."""
    _daemon, task, backstop, block, _watched = _held_by_a_watched_task(-100)
    apply(backstop, 100.25)
    block.driver_launches += 500
    apply(backstop, 100.35)
    assert not task.hold_leaked and _baseline(task)[1] is None
