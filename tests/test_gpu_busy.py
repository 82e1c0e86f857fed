"""NVML's per-process samples as evidence of a hold that leaks (daemon/gpu_busy.py): read off
the daemon's loop, only for the GPUs the backstop names, and a task whose processes are still
on the SMs once held outright for GPU_SETTLE_S is a leak (backstop_plan.py). NVML is faked."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from gpreempt.daemon.backstop_plan import GPU_SETTLE_S, HoldFacts, plan_backstop
from gpreempt.daemon.gpu_busy import PERIOD_S, GpuBusy
from gpreempt.nvml import NA, Nvml


class FakeNv:
    """A GPU on which process 42 is on the SMs at ``busy_at`` (unix time)."""

    def __init__(self, busy_at: float) -> None:
        self.busy_at = busy_at
        self.asked: list[tuple[int, float]] = []

    def sm_busy(self, gpu: int, since: float) -> dict[int, float]:
        self.asked.append((gpu, since))
        return {42: self.busy_at} if self.busy_at > since else {}


def test_samples_after_the_settle_time_are_seen_and_earlier_ones_are_not() -> None:
    watch = GpuBusy(clock=lambda: 1001.0)
    watch.read(FakeNv(busy_at=1000.5), [0], since=999.0)
    assert watch.busy_after([42], 1000.0)
    assert not watch.busy_after([42], 1000.5)
    assert not watch.busy_after([7], 0.0)


def test_the_thread_reads_only_the_gpus_named_and_stops_when_none_are() -> None:
    nv = FakeNv(busy_at=time.time() + 3600)
    watch = GpuBusy(open_nvml=lambda: nv, period_s=0.01)
    assert nv.asked == []  # nothing held: NVML is not even opened
    watch.watch({1})
    deadline = time.monotonic() + 5
    while not watch.busy_after([42], time.time()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.busy_after([42], time.time())
    assert {gpu for gpu, _ in nv.asked} == {1}
    watch.watch(())
    time.sleep(0.05)
    count = len(nv.asked)
    time.sleep(0.1)
    assert len(nv.asked) == count


def test_no_nvml_watches_nothing() -> None:
    watch = GpuBusy(open_nvml=lambda: NA("nvidia-ml-py is not installed"), period_s=0.01)
    watch.watch({0})
    deadline = time.monotonic() + 5
    while watch.unavailable is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.unavailable == "nvidia-ml-py is not installed"
    assert not watch.busy_after([42], 0.0)


def test_nvml_samples_are_read_per_process() -> None:
    class Lib:
        def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
            return f"gpu{index}"

        def nvmlDeviceGetProcessUtilization(self, handle: str, since_us: int) -> list:
            sample = SimpleNamespace
            return [
                sample(pid=42, smUtil=30, timeStamp=2_000_000),
                sample(pid=42, smUtil=10, timeStamp=3_000_000),
                sample(pid=7, smUtil=0, timeStamp=3_000_000),
            ]

    assert Nvml(Lib()).sm_busy(0, since=1.0) == {42: 3.0}


def _held(**fields) -> HoldFacts:
    values = dict(
        task_id=1, uid=1000, priority=-100, gpus=(0,), held=False, backed_up=True,
        gate_held_since=100.0, held_on_gpu=True, lock_tried=False, counts_launches=False,
        launches=0, channels=1, must_stand_still=True, hold_baseline=None, hold_leaked=False,
    )  # fmt: skip
    values.update(fields)
    return HoldFacts(**values)


@pytest.mark.parametrize(
    ("fields", "leaks"),
    [
        ({"gpu_busy": True}, True),
        ({"gpu_busy": False}, False),
        ({"gpu_busy": True, "must_stand_still": False}, False),  # closed only while watched
        ({"gpu_busy": True, "hold_leaked": True}, False),  # said once a suspension
        ({"gpu_busy": True, "untrusted": True}, False),  # backed up at once anyway
    ],
)
def test_a_task_seen_on_the_sms_once_held_is_a_leak(fields: dict, leaks: bool) -> None:
    plan = plan_backstop([_held(**fields)], 100.0 + GPU_SETTLE_S, delay_s=0.05, lock=True)
    found = [leak for leak in plan.leaks if leak.gpu]
    assert bool(found) == leaks
    if leaks:
        assert found[0].locked and 1 in plan.locks


class RecordingBusy(GpuBusy):
    """Keeps each set of GPUs the backstop asks to watch; reads nothing."""

    def __init__(self) -> None:
        super().__init__(open_nvml=lambda: NA("not read here"))
        self.asked: list[frozenset[int]] = []

    def watch(self, gpus) -> None:
        self.asked.append(frozenset(gpus))


def test_a_short_hold_costs_no_nvml_call_and_a_long_one_is_watched_in_time() -> None:
    """A server's requests hold a trainer a few ms at a time: its GPU is watched only once a
    hold outright has lasted WATCH_AFTER_S, early enough for the samples that count (from
    GPU_SETTLE_S on), and the backstop asks to be called back then."""
    from gpreempt.control_block import ControlBlock
    from gpreempt.daemon.backstop import WATCH_AFTER_S, Backstop
    from gpreempt.daemon.registry import Registry
    from gpreempt.daemon.task import Task
    from gpreempt.daemon.task_identity import TaskIdentity
    from gpreempt.daemon.task_state import TaskState, change_state

    assert GPU_SETTLE_S - WATCH_AFTER_S >= 2 * PERIOD_S
    registry = Registry()
    task = Task(TaskIdentity(task_id=registry.new_id(), pid=4242, pgid=None, start_time=0,
                             uid=1000, name="trainer", priority=-100, gpus=(3,),
                             mechanism="auto"))  # fmt: skip
    registry.add(task)
    block = ControlBlock.create()
    try:
        block.set_gate(True)  # closed outright
        task.controls = {1: block}
        seen = RecordingBusy()
        backstop = Backstop(registry, SimpleNamespace(), 0.0, gpu_busy=seen)
        change_state(task, TaskState.SUSPENDED, now=100.0, mechanism="gate")
        now, watched_from = 100.005, None
        while now < 103.0:  # the daemon's loop: a pass at each time the backstop names
            backstop.plan(now)
            if seen.asked[-1] and watched_from is None:
                watched_from = now
            assert bool(seen.asked[-1]) == (now >= 100.0 + WATCH_AFTER_S)
            due = backstop.next_due(now)
            assert due is None or due > now
            now = 103.0 if due is None else due
        assert watched_from == pytest.approx(100.0 + WATCH_AFTER_S)
        assert seen.asked[-1] == {3}
        backstop.plan(100.0 + WATCH_AFTER_S - 0.001)  # its watch falls due just after a pass
        assert backstop.next_due(100.0 + WATCH_AFTER_S + 0.001) == 100.0 + WATCH_AFTER_S
        block.close_while_watched(1)  # its barriers hold it now: its launches prove nothing
        backstop.plan(103.0)
        assert seen.asked[-1] == frozenset()
    finally:
        block.close()
