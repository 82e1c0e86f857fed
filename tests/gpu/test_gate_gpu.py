"""The launch gate on a real GPU: events, bounds, drain, graphs, identical training."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import toggling, wait_for

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA (or ROCm) GPU"),
]

from gpreempt.client import gate as gate_mod  # noqa: E402
from gpreempt.client.gate import install_gate, resolve_config  # noqa: E402
from gpreempt.control_block import ControlBlock  # noqa: E402


@pytest.fixture
def control():
    torch.cuda.init()
    block = ControlBlock.create()
    yield block
    current = gate_mod.current_gate()
    if current is not None:
        current.uninstall()
    block.close()


def _matmuls(n: int, size: int = 2048) -> torch.Tensor:
    a = torch.randn(size, size, device="cuda")
    for _ in range(n):
        a = torch.tanh(a @ a * 1e-3)
    return a


def test_bound_records_events_and_limits_work_in_flight(control):
    gate = install_gate(
        control,
        resolve_config(
            bound=True,
            auto_activity=False,
            mode="tight",
            record_every=4,
            window_launches=8,
            window_ms=0.5,
        ),
    )
    assert gate.native
    _matmuls(400)
    torch.cuda.synchronize()
    stats = gate.stats()
    assert stats["device_live"]
    assert stats["error"] is None
    assert stats["events_recorded"] > 50
    assert stats["bound_waits"] > 0
    # the GPU time it counts: the average per launch, or (with so few launches in flight that
    # the queue rarely stays full through a segment) the operators' own timings
    costs = {name: us for name, _calls, us, _exact, _bounds in stats["op_costs"]}
    assert stats["us_per_launch"] > 0 or costs["aten::mm"] > 0
    assert control.stats().window == stats["window"]


def test_long_operators_count_at_their_own_cost(control):
    """A burst of long operators after many cheap ones (an optimizer step after the backward
    pass) must not fill the GPU beyond the window: at the average cost a 0.5 ms window would
    admit the whole burst."""
    gate = install_gate(
        control, resolve_config(bound=True, auto_activity=False, mode="tight", window_ms=0.5)
    )
    small = torch.zeros(1024, device="cuda")
    a = torch.randn(2048, 2048, device="cuda")
    queued_ms = []
    for _ in range(12):
        for _ in range(300):
            small.add_(1.0)
        for _ in range(12):
            torch.mm(a, a)
        start = time.perf_counter()
        torch.cuda.synchronize()
        queued_ms.append((time.perf_counter() - start) * 1e3)
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    start_event.record()
    torch.mm(a, a)
    end_event.record()
    end_event.synchronize()
    heavy_ms = start_event.elapsed_time(end_event)
    stats = gate.stats()
    costs = {name: (us, exact) for name, _calls, us, exact, _bounds in stats["op_costs"]}
    assert stats["error"] is None
    assert costs["aten::mm"][1] > 0, "the long operator was never timed exactly"
    assert costs["aten::mm"][0] > 20 * max(costs["aten::add_"][0], 1.0)
    assert heavy_ms > 0.2, "the long operator is too short on this GPU to test anything"
    # what was still queued when the burst's last launch returned: the window and one operator,
    # not the whole burst (12 operators); the first bursts teach the costs
    assert sorted(queued_ms[4:])[-2] < 0.5 + 3 * heavy_ms, (queued_ms, heavy_ms)


def test_closed_gate_blocks_cuda_ops_and_drain_empties_the_queue(control):
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False))
    _matmuls(200)
    gate.drain()
    assert torch.cuda.current_stream().query()
    control.set_gate(True)

    def opener() -> None:
        time.sleep(0.2)
        control.set_gate(False)

    thread = threading.Thread(target=opener)
    thread.start()
    start = time.monotonic()
    _matmuls(1)
    assert time.monotonic() - start >= 0.15
    thread.join()
    assert gate.stats()["waits"] >= 1


def test_graph_capture_and_replay_under_the_gate(control):
    config = resolve_config(
        bound=True, auto_activity=True, mode="tight", record_every=2, window_launches=2
    )
    gate = install_gate(control, config)
    static_in = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_out = torch.relu(static_in @ static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(static_in @ static_in)
        for _ in range(20):
            static_out = static_out * 0.5 + 1.0
    assert gate.stats()["captures"] == 0
    with toggling(control, closed_s=0.001, open_s=0.001):
        for _ in range(50):
            graph.replay()
    torch.cuda.synchronize()
    expected = torch.relu(static_in @ static_in)
    for _ in range(20):
        expected = expected * 0.5 + 1.0
    torch.testing.assert_close(static_out, expected)
    assert gate.stats()["error"] is None


def _train(seed: int, compiled: bool = False) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.LayerNorm(1024),
        torch.nn.Linear(1024, 256),
    ).cuda()
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for _ in range(30):
        x = torch.randn(64, 256, device="cuda", generator=gen)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(x).float().pow(2).mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_gated_gpu_training_is_bit_identical(control):
    reference = _train(5)
    if not all(torch.equal(reference[k], v) for k, v in _train(5).items()):
        pytest.skip("training is not deterministic on this GPU even without the gate")
    config = resolve_config(
        bound=True, auto_activity=True, mode="tight", record_every=4, window_launches=4
    )
    gate = install_gate(control, config)
    with toggling(control, closed_s=0.001, open_s=0.002):
        gated = _train(5)
    assert gate.stats()["waits"] > 0
    for name, value in reference.items():
        assert torch.equal(value, gated[name]), name


def test_compiled_training_under_the_gate_is_bit_identical(control):
    """torch.compile's Triton kernels are invisible to the gate; the operators around them (the
    optimizer, the loss, allocations, library GEMMs) are not, so a closed gate still stops the
    step, and the gated run computes exactly the same weights."""
    try:
        reference = _train(5, compiled=True)
    except Exception as exc:  # Inductor needs Triton and a C compiler
        pytest.skip(f"torch.compile does not work on this machine: {exc}")
    if not all(torch.equal(reference[k], v) for k, v in _train(5, compiled=True).items()):
        pytest.skip("compiled training is not deterministic on this GPU even without the gate")
    config = resolve_config(
        bound=True, auto_activity=True, mode="tight", record_every=4, window_launches=4
    )
    gate = install_gate(control, config)
    with toggling(control, closed_s=0.001, open_s=0.002):
        gated = _train(5, compiled=True)
    stats = gate.stats()
    assert stats["waits"] > 0 and stats["error"] is None
    for name, value in reference.items():
        assert torch.equal(value, gated[name]), name


def test_gate_notices_cuda_initialised_after_install(tmp_path):
    code = textwrap.dedent(
        """
        import torch
        from gpreempt.client.gate import install_gate, resolve_config
        from gpreempt.control_block import ControlBlock
        control = ControlBlock.create()
        config = resolve_config(bound=True, auto_activity=False, record_every=4)
        gate = install_gate(control, config)
        assert not gate.stats()["device_live"]
        x = torch.ones(1000, device="cuda")
        for _ in range(100):
            x = x * 1.0
        torch.cuda.synchronize()
        stats = gate.stats()
        assert stats["device_live"], stats
        assert stats["events_recorded"] > 0, stats
        gate.uninstall()
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stdout


def test_dataloader_workers_run_under_an_installed_gate(control):
    install_gate(control, resolve_config(bound=True, auto_activity=True))
    _matmuls(5)
    dataset = torch.utils.data.TensorDataset(torch.arange(256, dtype=torch.float32))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=16, num_workers=2, multiprocessing_context="fork"
    )
    total = sum(float(batch[0].sum()) for batch in loader)
    assert total == float(sum(range(256)))


def _seconds_queued_work_waits(close, control, open_after_s: float = 0.4) -> float:
    """Queue more work than the GPU runs while the CPU launches it, ``close()`` the gate, open
    it again after ``open_after_s``: how long until the queued work had all run."""
    _matmuls(300, size=4096)
    close()
    done = torch.cuda.Event()
    done.record()
    opener = threading.Timer(open_after_s, control.set_gate, (False,))
    began = time.monotonic()
    opener.start()
    done.synchronize()
    held = time.monotonic() - began  # before the join, which lasts until the opener has run
    opener.join()
    return held


def test_stream_barriers_hold_queued_work_on_the_gpu_while_a_watched_task_is_active(control):
    """With barriers, a watched task's request holds this process's queued work at the next
    barrier on the GPU while the CPU goes on launching; the work completes once it ends. A
    plain close by the daemon holds it too (bit 0 of gate_closed)."""
    high = ControlBlock.create()
    high.keep_mapped()  # as the session keeps watched blocks: the GPU registered its page
    try:
        control.set_window_share(1.0)  # a more important task is registered: barriers hold
        gate = install_gate(
            control, resolve_config(bound=True, auto_activity=False, barrier_ms=0.05)
        )
        gate.watch([high.address], 1)
        _matmuls(20)
        torch.cuda.synchronize()
        assert gate.stats()["barriers"], gate.stats()["error"]
        high.set_requests(1)
        control.set_gate(True)
        control.close_while_watched(1)  # as the daemon writes it for a watched-only closure
        ender = threading.Timer(0.4, high.set_requests, (0,))
        began = time.monotonic()
        ender.start()
        out = _matmuls(30)  # well inside the open window: the CPU is not stopped
        done = torch.cuda.Event()
        done.record()
        launched = time.monotonic() - began
        done.synchronize()
        finished = time.monotonic() - began
        ender.join()
        assert launched < 0.3, launched
        assert finished >= 0.35, "the GPU ran the work while the watched task was active"
        assert torch.isfinite(out).all()
        assert gate.stats()["barriers_put"] > 0
        control.set_gate(False)
        # a plain close holds what is already queued, at its next barrier
        held = _seconds_queued_work_waits(lambda: control.set_gate(True), control)
        assert held >= 0.35, "the GPU ran queued work while the gate was closed"
        assert gate.stats()["error"] is None
    finally:
        current = gate_mod.current_gate()
        if current is not None:
            current.uninstall()
        high.close()


def test_stream_barriers_on_an_incomplete_watch_list_wait_for_the_daemon(control):
    """A gate whose watch list is incomplete (version 0) does not go on by itself on a 2V word:
    neither does the GPU at its barriers, which then wait for the daemon's plain 0."""
    control.set_window_share(1.0)
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False, barrier_ms=0.05))
    gate.watch([], 0)
    _matmuls(20)
    torch.cuda.synchronize()
    held = _seconds_queued_work_waits(lambda: control.close_while_watched(1), control)
    assert held >= 0.35, "the GPU went past a barrier on a word its list does not release"
    assert gate.stats()["error"] is None


def test_stream_barriers_put_from_threads_new_to_cuda(control):
    """An operator on a thread that has not called CUDA yet may be the one to put a barrier;
    the barrier borrows the device's context and barriers stay on."""
    control.set_window_share(1.0)
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False, barrier_ms=0.001))
    a = torch.randn(512, 512, device="cuda")
    torch.cuda.synchronize()
    results = []

    def one_op() -> None:
        results.append(float((a @ a).sum()))

    for _ in range(20):
        worker = threading.Thread(target=one_op)
        worker.start()
        worker.join()
    assert len(results) == 20
    stats = gate.stats()
    assert stats["error"] is None, stats["error"]
    assert stats["barriers"] and stats["barriers_put"] > 0


def test_stream_barriers_only_while_a_more_important_task_is_registered(control):
    """Without an in-flight share from the daemon nobody can preempt the task: no barriers are
    put (they would cost GPU time for nothing), and the window is not tight."""
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False, barrier_ms=0.05))
    _matmuls(50)
    torch.cuda.synchronize()
    assert gate.stats()["barriers"] and gate.stats()["barriers_put"] == 0
    control.set_window_share(1.0)
    _matmuls(50)
    torch.cuda.synchronize()
    stats = gate.stats()
    assert stats["barriers_put"] > 0 and not stats["tight"], stats


def test_an_asleep_gate_keeps_stream_barriers_and_wakes_when_its_gpu_falls_behind(control):
    """Asleep (its operator hook off), a gate whose task a more important one may preempt still
    puts stream barriers from its sleep thread where work is queued: that work is held on the
    GPU the moment a watched task becomes active. Work that takes the GPU longer than the
    barriers' bound wakes the gate (backlog_wakes), which stays awake while the daemon still
    allows sleep."""
    high = ControlBlock.create()
    high.keep_mapped()
    try:
        control.set_window_share(1.0)
        config = resolve_config(bound=True, auto_activity=False, barrier_ms=0.05)
        # woken for a backlog, it may sleep again after a second (the test waits for that)
        gate = install_gate(control, dataclasses.replace(config, backlog_hold_s=1.0))
        gate.watch([high.address], 1)
        _matmuls(20)
        torch.cuda.synchronize()
        control.set_sleep_ok(True)
        assert wait_for(lambda: gate.stats()["asleep"], 2.0, 0.001)
        # a process whose GPU keeps up: asleep, no operator seen, no backlog
        a = torch.randn(256, 256, device="cuda")
        launches = gate.stats()["launches"]
        for _ in range(40):
            a = torch.tanh(a @ a * 1e-3)
            time.sleep(0.001)
        torch.cuda.synchronize()
        stats = gate.stats()
        assert stats["asleep"] and stats["launches"] == launches, stats
        assert stats["backlog_wakes"] == 0, stats
        # an idle stream gets no barrier: there is nothing to hold, and each would cost the
        # other processes on the GPU a switch to this one
        time.sleep(0.01)  # a barrier the thread was putting as the stream drained
        idle_from = gate.stats()["asleep_barriers"]
        time.sleep(0.05)
        assert gate.stats()["asleep_barriers"] == idle_from, gate.stats()
        # work queued while asleep is held at the thread's next barrier behind it the moment a
        # watched task becomes active (12 large products queued at once are a backlog too: the
        # gate may wake for it if the GPU reaches a barrier before the watched task starts)
        out = _matmuls(12, size=4096)
        time.sleep(0.005)  # the thread puts barriers behind it
        assert gate.stats()["asleep_barriers"] > idle_from, gate.stats()
        high.set_requests(1)  # while the GPU is still on that work
        done = torch.cuda.Event()
        done.record()  # not an operator: nothing the woken hook could put a barrier before
        ender = threading.Timer(0.4, high.set_requests, (0,))
        began = time.monotonic()
        ender.start()
        done.synchronize()
        held = time.monotonic() - began
        ender.join()
        assert held >= 0.3, "the GPU ran work queued while asleep through a watched task's request"
        assert torch.isfinite(out).all()
        # work that takes the GPU longer than the barriers' bound: the gate wakes and stays
        # awake. Launched faster than the GPU runs it, a product every 0.5 ms, so that the
        # thread's barriers (every ms) fall between the launches whatever the GPU's speed
        assert wait_for(lambda: gate.stats()["asleep"], 3.0, 0.001), gate.stats()
        wakes = gate.stats()["backlog_wakes"]
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(200):
            a = torch.tanh(a @ a * 1e-3)
            time.sleep(0.0005)
            if gate.stats()["backlog_wakes"] > wakes:
                break
        assert gate.stats()["backlog_wakes"] > wakes, gate.stats()
        torch.cuda.synchronize()
        time.sleep(0.05)
        stats = gate.stats()
        assert not stats["asleep"], "woken for a backlog, the gate went back to sleep at once"
        assert stats["error"] is None, stats["error"]
    finally:
        current = gate_mod.current_gate()
        if current is not None:
            current.uninstall()
        high.close()


def test_warm_launches_outside_a_capture_and_leaves_a_capture_alone(control, monkeypatch):
    """Entering a request warms the GPU with a no-op kernel on the current stream; inside a
    CUDA graph capture it launches nothing (the kernel would join the graph)."""
    launched = []
    real_sleep = torch.cuda._sleep

    def sleep(cycles: int) -> None:
        launched.append(torch.cuda.is_current_stream_capturing())
        real_sleep(cycles)

    monkeypatch.setattr(torch.cuda, "_sleep", sleep)
    gate = install_gate(control, resolve_config(bound=False, auto_activity=False))
    x = torch.zeros(16, device="cuda")
    gate.warm()
    torch.cuda.synchronize()
    assert launched == [False]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gate.warm()
        x.add_(1)
    assert launched == [False]
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full_like(x, 4.0))
