"""Which tasks ``gpreempt run`` gives stream barriers to."""

from __future__ import annotations

import pytest

from gpreempt.client import agent
from gpreempt.client import gate as gate_mod
from gpreempt.config import ENV_AUTO_ACTIVITY, ENV_GRACE_MS
from gpreempt.priority import NAMED


class _Session:
    def __init__(self, mechanism: str) -> None:
        self.gate = None
        self.priority = -100
        self.mechanism = mechanism
        self.control = object()
        self.driver_gate = False

    def use_gate(self, gate) -> None:  # noqa: ANN001
        self.gate = gate


@pytest.mark.parametrize(
    ("mechanism", "env", "expected"),
    [
        ("gate", None, gate_mod.RUN_BARRIER_MS),  # the default for the gate mechanism
        ("gate", "0", 0.0),  # the environment decides (0: none)
        ("gate", "0.05", 0.05),
        ("auto", None, gate_mod.RUN_BARRIER_MS),  # the default mechanism: the same
        ("auto", "0", 0.0),
        ("lock", None, 0.0),
        ("lock", "0.05", 0.0),  # other mechanisms: none, whatever the environment says
    ],
)
def test_barriers_by_mechanism(monkeypatch, mechanism, env, expected) -> None:
    seen = {}
    monkeypatch.setattr(
        gate_mod, "install_gate", lambda control, config: seen.update(config=config) or "g"
    )
    monkeypatch.delenv(agent.ENV_GATE, raising=False)
    if env is None:
        monkeypatch.delenv(gate_mod.ENV_BARRIER_MS, raising=False)
    else:
        monkeypatch.setenv(gate_mod.ENV_BARRIER_MS, env)
    current = _Session(mechanism)
    assert agent.install_gate_for(current) == "g" and current.gate == "g"
    assert seen["config"].barrier_ms == expected


def test_the_gate_config_by_priority(monkeypatch) -> None:
    """A task that preempts gets an unbounded gate with a short grace, one that may be preempted a
    bounded gate whose grace covers its loop's pauses; both notice their own activity."""
    for name in (agent.ENV_GATE_BOUND, ENV_AUTO_ACTIVITY, ENV_GRACE_MS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(gate_mod.ENV_BARRIER_MS, raising=False)
    high = agent.gate_config_for(NAMED["high"], "auto")
    low = agent.gate_config_for(NAMED["low"], "lock")
    assert (high.bound, high.auto_activity, high.idle_grace_ms) == (False, True, 0.2)
    assert high.barrier_ms == gate_mod.RUN_BARRIER_MS
    assert (low.bound, low.auto_activity, low.idle_grace_ms, low.barrier_ms) == (True, True, 2, 0)
    monkeypatch.setenv(agent.ENV_GATE_BOUND, "0")
    assert not agent.gate_config_for(NAMED["low"], "auto").bound


@pytest.mark.parametrize("operator_gate", ["1", "0"])
def test_the_driver_level_gate_takes_the_sessions_block_with_or_without_the_operator_gate(
    monkeypatch, operator_gate
) -> None:
    """``GPREEMPT_GATE=0`` turns off the operator gate only: the driver-level gate still gets the
    session's control block (and publishes the activity the operator gate would have), rather
    than registering the process a second time over a channel of its own."""
    adopted, installed = [], []
    monkeypatch.setattr(
        agent, "adopt_driver_gate", lambda current, torch_gate: adopted.append(torch_gate)
    )
    monkeypatch.setattr(gate_mod, "install_gate", lambda control, config: installed.append(1))
    monkeypatch.setenv(agent.ENV_GATE, operator_gate)
    agent.install_gate_for(_Session("auto"))
    assert adopted == [operator_gate == "1"]
    assert installed == ([1] if operator_gate == "1" else [])


def test_without_pytorch_the_driver_level_gate_takes_the_block_whatever_gpreempt_gate_says(
    monkeypatch,
) -> None:
    adopted = []
    monkeypatch.setattr(
        agent, "adopt_driver_gate", lambda current, torch_gate: adopted.append(torch_gate) or True
    )
    monkeypatch.setenv(agent.ENV_GATE, "0")
    current = _Session("auto")
    current.barriers = None
    assert agent.start_barriers_for(current) is None
    assert adopted == [False]
