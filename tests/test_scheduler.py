"""GPUScheduler: priorities between threads of one process, through the native gate (CPU)."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

import gpreempt  # noqa: E402
from gpreempt.client.gate.build import NativeGateUnavailable, load_native  # noqa: E402
from gpreempt.client.scheduler import GPUScheduler  # noqa: E402
from gpreempt.errors import UsageError  # noqa: E402


@pytest.fixture(scope="module")
def native() -> None:
    try:
        load_native()
    except NativeGateUnavailable as exc:
        pytest.skip(f"native gate unavailable: {exc}")


def test_low_thread_waits_while_high_request_is_open(native) -> None:
    sched = GPUScheduler()
    progress = {"low": 0}
    windows: list[tuple[int, int]] = []
    x = torch.zeros(64)

    def low_step() -> bool:
        nonlocal x
        x = x + 1  # an operator: gated
        progress["low"] += 1
        time.sleep(0.001)
        return len(windows) < 2  # both requests seen: the run ends

    def high_call() -> bool:
        time.sleep(0.2)
        with gpreempt.request():
            torch.ones(4) * 2  # the high task itself is never held
            before = progress["low"]
            time.sleep(0.4)
            windows.append((before, progress["low"]))
        return len(windows) < 2

    sched.register_task("case-b", low_step, priority="low")
    sched.register_task("case-a", high_call, priority="high", active_during_call=False)
    started = time.monotonic()
    try:
        stats = sched.run(duration_s=10)
    finally:
        sched.close()
    wall = time.monotonic() - started
    assert len(windows) == 2
    for before, after in windows:
        assert after - before <= 1, "the low task kept launching inside the high request"
    assert progress["low"] > 50, "the low task did not run outside the requests"
    assert stats["case-b"]["suspended_seconds"] >= 0.7
    assert stats["case-b"]["run_seconds"] + stats["case-b"]["suspended_seconds"] <= wall + 0.1
    assert stats["case-a"]["calls"] == 2


def test_existing_threads_join_with_task_context(native) -> None:
    sched = GPUScheduler()
    stop = threading.Event()
    count = [0]

    def background() -> None:
        with sched.task("trainer", priority="low"):
            y = torch.zeros(8)
            while not stop.is_set():
                y = y + 1
                count[0] += 1
                time.sleep(0.001)

    worker = threading.Thread(target=background)
    worker.start()
    try:
        with sched.task("server", priority="high"):
            time.sleep(0.2)
            with gpreempt.request():
                time.sleep(0.05)
                before = count[0]
                time.sleep(0.3)
                inside = count[0] - before
            time.sleep(0.2)
            after = count[0]
        assert inside <= 1
        assert after - before - inside > 10
    finally:
        stop.set()
        sched.stop()
        worker.join(5)
        sched.close()


def test_timeslice_between_threads(native) -> None:
    sched = GPUScheduler(policy="timeslice")
    counts = {"a": 0, "b": 0}
    tensors = {"a": torch.zeros(8), "b": torch.zeros(8)}

    def stepper(name: str):
        def step() -> None:
            tensors[name] = tensors[name] + 1
            counts[name] += 1
            time.sleep(0.0005)

        return step

    sched.register_task("a", stepper("a"), priority="normal", time_slice_ms=80)
    sched.register_task("b", stepper("b"), priority="normal", time_slice_ms=20)
    try:
        sched.run(duration_s=2.0)
    finally:
        sched.close()
    ratio = counts["a"] / max(1, counts["b"])
    assert 2.5 <= ratio <= 6.0, f"steps split {counts}, expected about 4:1"


def test_bad_registrations() -> None:
    sched = GPUScheduler(gate=object())
    with pytest.raises(UsageError):
        GPUScheduler(policy="fifo")
    with pytest.raises(UsageError):
        sched.run()
    with pytest.raises(gpreempt.PriorityError):
        sched.register_task("x", lambda: None, priority="urgent")
