"""Which tasks ``gpreempt run`` gives stream barriers to."""

from __future__ import annotations

import pytest

from gpreempt.client import agent
from gpreempt.client import gate as gate_mod


class _Session:
    def __init__(self, mechanism: str) -> None:
        self.gate = None
        self.priority = -100
        self.mechanism = mechanism
        self.control = object()

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
