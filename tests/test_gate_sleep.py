"""The native gate sleeps (its operator hook off) while the daemon allows it, and wakes the
moment the daemon withdraws that, closes the gate or a watched task becomes active."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from gpreempt.client import gate as gate_mod  # noqa: E402
from gpreempt.client.gate import install_gate, resolve_config  # noqa: E402
from gpreempt.client.gate.build import NativeGateUnavailable, load_native  # noqa: E402
from gpreempt.control_block import ControlBlock  # noqa: E402


@pytest.fixture
def control():
    try:
        load_native()
    except NativeGateUnavailable as exc:
        pytest.skip(f"native gate unavailable: {exc}")
    block = ControlBlock.create()
    yield block
    current = gate_mod.current_gate()
    if current is not None:
        current.uninstall()
    block.close()


def _until(predicate, timeout_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return predicate()


def _launches_seen(gate, x) -> int:
    before = gate.stats()["launches"]
    for _ in range(20):
        x = x + 1
    return gate.stats()["launches"] - before


def test_a_bound_gate_sleeps_only_while_the_daemon_allows_it(control):
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False))
    x = torch.ones(4)
    time.sleep(0.05)
    assert not gate.stats()["asleep"]  # never without the daemon's word
    assert _launches_seen(gate, x) >= 20

    control.set_sleep_ok(True)
    assert _until(lambda: gate.stats()["asleep"])
    assert _launches_seen(gate, x) == 0  # the hook is off: operators are not seen

    control.set_sleep_ok(False)
    assert _until(lambda: not gate.stats()["asleep"], 0.5)
    assert _launches_seen(gate, x) >= 20
    assert gate.stats()["sleeps"] == 1


def test_closing_the_gate_wakes_it_and_stops_the_next_operator(control):
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False))
    control.set_sleep_ok(True)
    assert _until(lambda: gate.stats()["asleep"])
    control.set_gate(True)
    assert _until(lambda: not gate.stats()["asleep"], 0.5)
    opener = threading.Timer(0.3, lambda: control.set_gate(False))
    opener.start()
    began = time.monotonic()
    y = torch.ones(4) + 1  # waits at the closed gate
    waited = time.monotonic() - began
    opener.join()
    assert waited >= 0.25
    assert torch.equal(y, torch.full((4,), 2.0))


def test_a_watched_task_starting_wakes_it(control):
    gate = install_gate(control, resolve_config(bound=True, auto_activity=False))
    high = ControlBlock.create()
    try:
        gate.watch([high.address])
        control.set_sleep_ok(True)
        assert _until(lambda: gate.stats()["asleep"])
        high.set_requests(1)
        assert _until(lambda: not gate.stats()["asleep"], 0.5)
        high.set_requests(0)
        assert _until(lambda: gate.stats()["asleep"])  # idle again: back to sleep
    finally:
        gate.watch([])
        high.close()


def test_an_unbound_gate_sleeps_once_its_process_uses_request_and_uninstall_restores_the_hook(
    control,
):
    gate = install_gate(control, resolve_config(bound=False, auto_activity=True))
    control.set_sleep_ok(True)
    time.sleep(0.05)
    assert not gate.stats()["asleep"]  # its launches are how others learn it is active
    control.set_requests(1)  # the first request(): from now on its requests say so
    control.set_requests(0)
    assert _until(lambda: gate.stats()["asleep"])
    assert _launches_seen(gate, torch.ones(4)) == 0
    control.set_gate(True)  # something more important closes it: awake at once
    assert _until(lambda: not gate.stats()["asleep"], 0.5)
    control.set_gate(False)
    gate.uninstall()
    bound = install_gate(control, resolve_config(bound=True, auto_activity=False))
    assert _until(lambda: bound.stats()["asleep"])
    bound.uninstall()  # while asleep
    again = install_gate(control, resolve_config(bound=True, auto_activity=False))
    assert _until(lambda: again.stats()["asleep"])
    control.set_sleep_ok(False)
    assert _until(lambda: not again.stats()["asleep"], 0.5)
    assert _launches_seen(again, torch.ones(4)) >= 20


def test_a_bound_gate_stands_aside_while_the_driver_level_gate_holds_its_block(control):
    """The driver-level gate sees every launch of the process and puts the barriers: the
    operator hook of a bound gate would only add its cost. It is back once the driver-level
    gate lets go (a profiler took CUPTI), even without the daemon's leave to sleep."""
    from gpreempt.control import DRIVER_STATES, OFF_DRIVER_GATE

    gate = install_gate(control, resolve_config(bound=True, auto_activity=False))
    x = torch.ones(4)
    control._set32(OFF_DRIVER_GATE, DRIVER_STATES.index("on"))
    control.set_gate(True)  # the driver-level gate waits at each launch: this one need not
    assert _until(lambda: gate.stats()["asleep"])
    assert _launches_seen(gate, x) == 0
    control.set_gate(False)
    control._set32(OFF_DRIVER_GATE, DRIVER_STATES.index("released"))
    assert _until(lambda: not gate.stats()["asleep"], 0.5)
    assert _launches_seen(gate, x) >= 20


def test_an_unbound_gate_keeps_its_hook_beside_the_driver_level_gate(control):
    """A server's operator hook tells its activity (the driver-level gate leaves that to it)."""
    from gpreempt.control import DRIVER_STATES, OFF_DRIVER_GATE

    gate = install_gate(control, resolve_config(bound=False, auto_activity=True))
    control._set32(OFF_DRIVER_GATE, DRIVER_STATES.index("on"))
    control.set_sleep_ok(True)
    time.sleep(0.05)
    assert not gate.stats()["asleep"]
    assert _launches_seen(gate, torch.ones(4)) >= 20


def test_a_server_whose_launches_count_sleeps_only_inside_a_marked_scope(control):
    """A marker of a part of each request (generate) does not hint: outside its scopes the
    server's launches tell its activity, inside one the process is active anyway, so the hook
    sleeps there even though the daemon gives no leave (a trainer below needs its activity)."""
    gate = install_gate(control, resolve_config(bound=False, auto_activity=True))
    x = torch.ones(4)
    time.sleep(0.05)
    assert not gate.stats()["asleep"]
    control.set_requests(1, hint=False)  # a generate call starts
    assert _until(lambda: gate.stats()["asleep"], 0.5)
    assert _launches_seen(gate, x) == 0
    control.set_requests(0, hint=False)  # it returned: the answer's copy must be seen
    assert _until(lambda: not gate.stats()["asleep"], 0.5)
    assert _launches_seen(gate, x) >= 20
    assert not control.hinted
