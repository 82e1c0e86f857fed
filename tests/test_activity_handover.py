"""A task that tells others when it is active, running PyTorch and another framework (JAX,
CuPy, ...): PyTorch's operator gate hands the task's activity to the driver-level gate, which
sees every launch (``agent.hand_activity_over``); the operator gate then leaves the word alone.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest

from gpreempt.client import agent
from gpreempt.client.gate import driver


@dataclass
class _Config:
    bound: bool = False
    auto_activity: bool = True


@dataclass
class _Gate:
    config: _Config = field(default_factory=_Config)
    takes: bool = True  # what hand_activity answers
    handed: list[bool] = field(default_factory=list)

    def hand_activity(self, handed: bool = True) -> bool:
        self.handed.append(handed)
        return self.takes


@dataclass
class _Session:
    gate: _Gate | None = field(default_factory=_Gate)
    driver_gate: bool = True


@pytest.fixture
def driver_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The driver-level gate on, taking activity; what was asked of it."""
    asked: list[str] = []
    monkeypatch.setattr(driver, "state", lambda: "on")
    monkeypatch.setattr(driver, "take_activity", lambda: asked.append("take") or True)
    return asked


def test_a_server_with_the_driver_level_gate_hands_its_activity_over(driver_on) -> None:
    current = _Session()
    assert agent.hand_activity_over(current)
    assert current.gate.handed == [True] and driver_on == ["take"]


def test_where_the_driver_level_gate_refuses_the_operator_gate_keeps_it(monkeypatch) -> None:
    monkeypatch.setattr(driver, "state", lambda: "on")
    monkeypatch.setattr(driver, "take_activity", lambda: False)
    current = _Session()
    assert not agent.hand_activity_over(current)
    assert current.gate.handed == [True, False]  # its own activity published again


@pytest.mark.parametrize(
    "current",
    [
        _Session(gate=_Gate(config=_Config(bound=True))),  # a trainer: it tells no activity
        _Session(gate=_Gate(config=_Config(auto_activity=False))),  # GPREEMPT_AUTO_ACTIVITY=0
        _Session(driver_gate=False),  # no driver-level gate took the block
        _Session(gate=None),  # no operator gate
    ],
)
def test_nothing_is_handed_where_no_gate_would_tell_it(driver_on, current) -> None:
    assert not agent.hand_activity_over(current)
    assert driver_on == []
    assert current.gate is None or current.gate.handed == []


@pytest.mark.parametrize("state", ["released", "unavailable", "failed", "none"])
def test_nothing_is_handed_while_the_driver_level_gate_is_not_on(monkeypatch, state) -> None:
    monkeypatch.setattr(driver, "state", lambda: state)
    monkeypatch.setattr(driver, "take_activity", lambda: pytest.fail("asked to take"))
    current = _Session()
    assert not agent.hand_activity_over(current)
    assert current.gate.handed == []


def test_a_gate_that_cannot_hand_it_over_leaves_the_driver_level_gate_alone(driver_on) -> None:
    current = _Session(gate=_Gate(takes=False))  # uninstalled meanwhile
    assert not agent.hand_activity_over(current)
    assert current.gate.handed == [True] and driver_on == []


def test_the_driver_level_gate_missing_takes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(driver, "library", lambda: None)
    assert driver.take_activity() is False


@pytest.mark.parametrize("name", ["jax", "cupy", "tensorflow", "tensorrt", "pycuda"])
def test_importing_another_framework_beside_torch_hands_activity_over(
    monkeypatch, driver_on, name
) -> None:
    current = _Session()
    monkeypatch.setattr(agent.session, "current", lambda: current)
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    agent.ON_IMPORT[name](types.ModuleType(name))
    assert current.gate.handed == [True] and driver_on == ["take"]


def test_without_torch_another_framework_hands_nothing(monkeypatch, driver_on) -> None:
    current = _Session()
    monkeypatch.setattr(agent.session, "current", lambda: current)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    agent.on_other_framework_imported(types.ModuleType("jax"))
    assert current.gate.handed == [] and driver_on == []


def test_torch_imported_after_another_framework_hands_activity_over(monkeypatch, driver_on):
    """``import jax`` first, then ``import torch``: the operator gate, once installed, hands
    its activity over at once."""
    from gpreempt.client import gate as gate_mod

    installed = _Gate()
    monkeypatch.setattr(gate_mod, "install_gate", lambda control, config: installed)
    monkeypatch.setattr(agent, "adopt_driver_gate", lambda current, torch_gate: False)
    monkeypatch.delenv(agent.ENV_GATE, raising=False)
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    current = types.SimpleNamespace(
        gate=None, priority=100, mechanism="auto", control=object(), driver_gate=True
    )
    current.use_gate = lambda gate: setattr(current, "gate", gate)
    assert agent.install_gate_for(current) is installed
    assert installed.handed == [True] and driver_on == ["take"]
