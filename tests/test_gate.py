"""The in-process launch gate on CPU tensors: blocking, counters, activity, identical training.

Every test runs against both implementations: the C++ RecordFunction hook (built on first use;
skipped where no compiler is available) and the Python TorchDispatchMode fallback.
"""

from __future__ import annotations

import ctypes
import os
import select
import threading
import time

import pytest
from conftest import toggling

torch = pytest.importorskip("torch")

from gpreempt.client import gate as gate_mod  # noqa: E402
from gpreempt.client.gate import install_gate, resolve_config  # noqa: E402
from gpreempt.client.gate.build import NativeGateUnavailable, load_native  # noqa: E402
from gpreempt.control import (  # noqa: E402
    DRIVER_FAILED,
    DRIVER_ON,
    DRIVER_RELEASED,
    OFF_DRIVER_GATE,
    closed_while_watched,
)
from gpreempt.control_block import ControlBlock  # noqa: E402
from gpreempt.errors import UsageError  # noqa: E402


@pytest.fixture(scope="session")
def native_available() -> bool:
    try:
        load_native()
    except NativeGateUnavailable as exc:
        pytest.skip(f"native gate unavailable: {exc}")
    return True


@pytest.fixture(params=["native", "python"])
def impl(request: pytest.FixtureRequest) -> str:
    if request.param == "native":
        request.getfixturevalue("native_available")
    return request.param


@pytest.fixture
def control():
    block = ControlBlock.create()
    yield block
    current = gate_mod.current_gate()
    if current is not None:
        current.uninstall()
    block.close()


def _install(control: ControlBlock, impl: str, **kwargs):
    kwargs.setdefault("bound", True)
    kwargs.setdefault("auto_activity", False)
    gate = install_gate(control, resolve_config(**kwargs), prefer_native=impl == "native")
    assert gate.native == (impl == "native")
    return gate


def _open_after(control: ControlBlock, delay: float) -> threading.Thread:
    def opener() -> None:
        time.sleep(delay)
        control.set_gate(False)

    thread = threading.Thread(target=opener)
    thread.start()
    return thread


def test_install_marks_control_block(control, impl):
    gate = _install(control, impl)
    stats = control.stats()
    assert stats.gate_installed
    assert stats.window == gate.config.window_launches
    assert gate.stats()["installed"]
    gate.uninstall()
    assert not control.stats().gate_installed
    assert not gate.stats()["installed"]


def test_closed_gate_blocks_next_op_until_opened(control, impl):
    gate = _install(control, impl)
    x = torch.ones(4)
    control.set_gate(True)
    opener = _open_after(control, 0.3)
    start = time.monotonic()
    y = x + 1  # blocks here
    waited = time.monotonic() - start
    opener.join()
    assert waited >= 0.25
    assert torch.equal(y, torch.full((4,), 2.0))
    stats = gate.stats()
    assert stats["waits"] >= 1
    assert stats["wait_seconds"] >= 0.25
    block = control.stats()
    assert block.waits == stats["waits"]
    assert block.wait_seconds >= 0.25


def test_closed_gate_releases_the_gil_while_waiting(control, impl):
    # torch.tensor() runs its operators with the GIL held; the opener thread needs the GIL
    _install(control, impl)
    control.set_gate(True)
    opener = _open_after(control, 0.2)
    start = time.monotonic()
    torch.tensor([1.0, 2.0]).sum()
    assert time.monotonic() - start >= 0.15
    opener.join(timeout=5)
    assert not opener.is_alive()


def test_open_gate_does_not_wait_and_counts_launches(control, impl):
    gate = _install(control, impl, record_every=8)
    x = torch.ones(8)
    before = gate.stats()["launches"]
    start = time.monotonic()
    for _ in range(200):
        x = x * 1.0
    assert time.monotonic() - start < 2.0
    stats = gate.stats()
    assert stats["launches"] - before >= 200
    assert stats["waits"] == 0
    # published at each segment boundary
    published = control.stats().launches
    assert 0 < published <= stats["launches"]
    assert published > stats["launches"] - gate.config.open_record_every


def test_native_gate_keeps_a_cost_entry_per_operator_name(control, native_available):
    gate = _install(control, "native", record_every=8)
    x = torch.ones(8)
    for _ in range(300):
        x = x * 1.0
    for _ in range(40):
        torch.sort(x)
    costs = {
        name: (calls, us, exact + bounds)
        for name, calls, us, exact, bounds in gate.stats()["op_costs"]
    }
    assert costs["aten::mul"][0] >= 300
    assert costs["aten::sort"][0] >= 40
    # no device: nothing is timed and every operator costs the (unknown) average
    assert all(us == 0 and samples == 0 for _, us, samples in costs.values())
    assert gate.stats()["samples_taken"] == 0


def test_uninstall_removes_the_hook(control, impl):
    gate = _install(control, impl)
    torch.ones(2) + 1
    launches = gate.stats()["launches"]
    gate.uninstall()
    control.set_gate(True)
    start = time.monotonic()
    for _ in range(10):
        torch.ones(2) + 1
    assert time.monotonic() - start < 1.0
    assert gate_mod.current_gate() is None
    # a fresh gate can be installed afterwards and sees the closed word
    control.set_gate(False)
    again = _install(control, impl)
    assert again.stats()["launches"] == 0
    again.uninstall()
    assert launches > 0


def test_second_install_is_refused(control, impl):
    _install(control, impl)
    with pytest.raises(RuntimeError, match="already installed"):
        _install(control, impl)


def _train(seed: int, steps: int = 40) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randn(steps, 8, 16)
    target = torch.randn(steps, 8, 4)
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data[step]), target[step])
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_gated_training_is_bit_identical(control, impl):
    reference = _train(seed=3)
    gate = _install(control, impl, record_every=4)
    with toggling(control, closed_s=0.002, open_s=0.003):
        gated = _train(seed=3)
    assert gate.stats()["waits"] > 0, "the toggler never caught an operator: test proves nothing"
    assert reference.keys() == gated.keys()
    for name in reference:
        assert torch.equal(reference[name], gated[name]), name


def test_threads_share_the_gate_safely(control, impl):
    gate = _install(control, impl, record_every=4)
    per_thread = 300
    errors: list[BaseException] = []

    def work() -> None:
        try:
            x = torch.ones(4)
            for _ in range(per_thread):
                x = x + 0.0
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    control.set_gate(True)
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    control.set_gate(False)
    for thread in threads:
        thread.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    if impl == "native":  # the Python fallback only sees the installing thread
        assert gate.stats()["launches"] >= 4 * per_thread
        assert gate.stats()["waits"] >= 1


def _doorbell_rings(control: ControlBlock, timeout: float) -> bool:
    ready, _, _ = select.select([control.doorbell], [], [], timeout)
    if ready:
        control.drain_doorbell()
    return bool(ready)


def test_auto_activity_publishes_transitions(control, impl):
    gate = _install(control, impl, bound=False, auto_activity=True, idle_grace_ms=20.0)
    assert not control.is_active()
    torch.ones(4) * 2
    assert control.stats().auto_active
    assert _doorbell_rings(control, 1.0)
    assert control.activity_epoch == 1  # each rise bumps it: watchers tell a drop between looks
    # keep launching: it stays active
    for _ in range(5):
        torch.ones(4) * 2
        time.sleep(0.005)
    assert control.stats().auto_active
    assert control.activity_epoch == 1
    # idle: drops after the grace time and rings again
    deadline = time.monotonic() + 3.0
    while control.stats().auto_active and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not control.stats().auto_active
    assert _doorbell_rings(control, 1.0)
    torch.ones(4) * 2
    assert control.stats().auto_active
    assert gate.stats()["activations"] == 2
    assert control.activity_epoch == 2
    gate.uninstall()
    assert not control.stats().auto_active


def test_a_gate_that_handed_its_activity_over_leaves_the_word_alone(control, impl):
    """The driver-level gate publishes the activity of a process that runs another framework
    beside PyTorch (agent.hand_activity_over): the operator gate neither raises nor drops it."""
    _driver_word(control).value = DRIVER_ON  # the driver-level gate holds CUPTI
    gate = _install(control, impl, bound=False, auto_activity=True, idle_grace_ms=20.0)
    torch.ones(4) * 2
    assert control.stats().auto_active  # its own rise, handed over as it stands
    assert gate.hand_activity(True)
    time.sleep(0.2)  # ten graces: its own idle check drops nothing it no longer publishes
    assert control.stats().auto_active
    control.set_auto_active(False)  # as the driver-level gate drops it
    torch.ones(4) * 2
    assert not control.stats().auto_active and control.activity_epoch == 1
    assert gate.hand_activity(False)  # its own again: idle, its last work long done
    assert not control.stats().auto_active
    torch.ones(4) * 2
    assert control.stats().auto_active
    gate.uninstall()
    assert not gate.hand_activity(True)  # nothing to hand once uninstalled


def _driver_word(control: ControlBlock) -> ctypes.c_uint32:
    """The control block's ``driver_gate`` word, as the driver-level gate writes it."""
    return ctypes.c_uint32.from_address(control.address + OFF_DRIVER_GATE)


def _until(predicate, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


@pytest.mark.parametrize("away", [DRIVER_RELEASED, DRIVER_FAILED], ids=["released", "failed"])
def test_a_gate_that_handed_its_activity_over_tells_it_while_cupti_is_away(control, impl, away):
    """While a profiler holds CUPTI (or the driver-level gate failed), the launches go unseen:
    the operator gate that handed its activity over tells it again, adopting a rise the
    driver-level gate left (dropped once idle: else a trainer would stay held through the
    profile), and stands aside again once the driver-level gate holds CUPTI."""
    word = _driver_word(control)
    word.value = DRIVER_ON
    gate = _install(control, impl, bound=False, auto_activity=True, idle_grace_ms=20.0)
    assert gate.hand_activity(True)
    control.set_auto_active(True)  # raised by the driver-level gate's launches
    time.sleep(0.3)
    assert control.stats().auto_active  # its to drop, while it holds CUPTI
    word.value = away
    assert _until(lambda: not control.stats().auto_active), "the rise it left never dropped"
    torch.ones(4) * 2
    assert control.stats().auto_active  # its own rise, told again
    assert _until(lambda: not control.stats().auto_active)
    word.value = DRIVER_ON  # CUPTI back: the launches tell the activity again
    time.sleep(0.05)
    torch.ones(4) * 2
    time.sleep(0.05)
    assert not control.stats().auto_active
    gate.uninstall()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_is_not_gated(control, impl):
    _install(control, impl)
    control.set_gate(True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        start = time.monotonic()
        torch.ones(4) + 1
        os._exit(0 if time.monotonic() - start < 2.0 else 1)
    deadline = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child blocked on its parent's gate")
    control.set_gate(False)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_share_from_the_daemon_keeps_the_window_tight(control, impl):
    gate = _install(control, impl)
    x = torch.zeros(4)

    def run_ops() -> bool:
        for _ in range(400):  # several open segments (one event per 128 launches)
            x.add_(1)
        return gate.stats()["tight"]

    assert run_ops() is False  # never closed, nobody more important: the open window
    control.set_window_share(0.25)
    assert run_ops() is True
    control.set_window_share(None)
    assert run_ops() is False


def test_drain_without_gpu_returns(control, impl):
    gate = _install(control, impl)
    torch.ones(2) + 1
    gate.drain()
    assert not gate.stats()["device_live"]


def test_config_precedence_and_validation(monkeypatch):
    monkeypatch.setenv("GPREEMPT_GATE_K", "16")
    monkeypatch.setenv("GPREEMPT_GATE_W", "2")
    monkeypatch.setenv("GPREEMPT_GATE_WINDOW_MS", "0.5")
    config = resolve_config(bound=True, auto_activity=False)
    assert (config.record_every, config.window_launches, config.window_ms) == (16, 32, 0.5)
    config = resolve_config(bound=True, auto_activity=False, record_every=8, window_ms=2.0)
    assert (config.record_every, config.window_launches, config.window_ms) == (8, 16, 2.0)
    monkeypatch.setenv("GPREEMPT_GATE_K", "many")
    with pytest.raises(UsageError, match="GPREEMPT_GATE_K"):
        resolve_config(bound=True, auto_activity=False)
    monkeypatch.delenv("GPREEMPT_GATE_K")
    with pytest.raises(UsageError, match="mode"):
        resolve_config(bound=True, auto_activity=False, mode="fast")
    assert resolve_config(bound=True, auto_activity=False).op_costs
    monkeypatch.setenv("GPREEMPT_GATE_OP_COSTS", "0")
    assert not resolve_config(bound=True, auto_activity=False).op_costs
    assert resolve_config(bound=True, auto_activity=False, op_costs=True).op_costs
    monkeypatch.setenv("GPREEMPT_GATE_OP_COSTS", "sometimes")
    with pytest.raises(UsageError, match="GPREEMPT_GATE_OP_COSTS"):
        resolve_config(bound=True, auto_activity=False)


def test_env_forces_python_fallback(control, monkeypatch):
    monkeypatch.setenv("GPREEMPT_GATE_NATIVE", "0")
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False))
    assert not gate.native


def _set_after(action, delay: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), action()))
    thread.start()
    return thread


def test_a_watched_task_becoming_active_stops_the_gate(control, impl):
    gate = _install(control, impl)
    high = ControlBlock.create()
    try:
        gate.watch([high.address])
        x = torch.ones(4)
        x + 1  # the watched task is idle: no wait
        assert gate.stats()["waits"] == 0
        for start, stop in (
            (lambda: high.set_auto_active(True), lambda: high.set_auto_active(False)),
            (lambda: high.set_requests(1), lambda: high.set_requests(0)),
        ):
            start()
            releaser = _set_after(stop, 0.3)
            began = time.monotonic()
            y = x + 1  # blocks until the watched task is idle again
            waited = time.monotonic() - began
            releaser.join()
            assert waited >= 0.25
            assert torch.equal(y, torch.full((4,), 2.0))
        # once it has used request(), its automatic activity alone no longer counts
        high.set_auto_active(True)
        x + 1
        assert gate.stats()["waits"] == 2
        high.set_requests(1)
        gate.watch([])  # nothing watched: passes again
        x + 1
        assert gate.stats()["waits"] == 2
    finally:
        gate.watch([])
        high.close()


@pytest.mark.parametrize(
    ("gate_version", "closed_for"),
    [(3, None), (2, 3), (0, 3)],
    ids=["plainly-closed", "older-list", "incomplete-list"],
)
def test_a_closed_gate_waits_for_the_daemon_even_after_the_watched_task_ends(
    control, impl, gate_version, closed_for
):
    """Plainly closed, the gate waits for the daemon. Closed only while the tasks of list 3
    are active, a gate that has not mapped that list (an older one, or none complete) waits
    for the daemon too: the daemon's newest list may hold a task that is active."""
    gate = _install(control, impl)
    high = ControlBlock.create()
    try:
        gate.watch([high.address], gate_version)
        high.set_requests(1)
        control.set_gate(True)
        if closed_for is not None:
            control.close_while_watched(closed_for)
        _set_after(lambda: high.set_requests(0), 0.1)
        opener = _open_after(control, 0.4)
        began = time.monotonic()
        torch.ones(2) + 1
        waited = time.monotonic() - began
        opener.join()
        assert waited >= 0.35
    finally:
        gate.watch([])
        high.close()


def test_a_gate_closed_only_while_watched_tasks_are_active_goes_on_when_they_end(control, impl):
    """The daemon wrote 2V: the gate waits only while the tasks of its watch list V are
    active, and goes on when they end without the daemon opening it."""
    gate = _install(control, impl)
    high = ControlBlock.create()
    try:
        gate.watch([high.address], 3)
        high.set_requests(1)
        control.set_gate(True)
        control.close_while_watched(3)
        for _ in range(2):  # the same word stops it again when the task is active again
            ender = _set_after(lambda: high.set_requests(0), 0.3)
            backstop = threading.Timer(3.0, control.set_gate, (False,))  # fail, not hang
            backstop.start()
            began = time.monotonic()
            y = torch.ones(2) + 1
            waited = time.monotonic() - began
            ender.join()
            assert 0.25 <= waited < 2.0, waited
            assert torch.equal(y, torch.full((2,), 2.0))
            # still closed: only the watch let it through
            assert control.gate_word == closed_while_watched(3)
            began = time.monotonic()
            torch.ones(2) + 1  # the watched task is idle: no wait at all
            assert time.monotonic() - began < 0.2
            backstop.cancel()
            control.close_while_watched(3)
            high.set_requests(1)
    finally:
        gate.watch([])
        high.close()
