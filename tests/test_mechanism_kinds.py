"""Mechanisms by capability: the daemon asks what a mechanism does, never its name."""

from __future__ import annotations

import ast
from pathlib import Path

from gpreempt.mechanisms import Mechanism, kind
from gpreempt.names import MechanismName

DAEMON_DIR = Path(__file__).resolve().parent.parent / "src" / "gpreempt" / "daemon"


def test_capabilities() -> None:
    assert kind("gate").closes_gate and kind("gate").in_process
    assert kind("auto").closes_gate and kind("auto").backed_up
    assert not kind("auto").in_process  # what suspended the task says, not the request
    assert kind("lock").holds_driver_lock and not kind("lock").closes_gate
    assert kind("signal").stops_process and not kind("signal").in_process
    assert kind("kfd").stops_process and kind("kfd").unmaps_queues
    assert not any(kind(n).backed_up for n in ("gate", "lock", "signal", "kfd"))
    assert [n for n in MechanismName if kind(n).chooses] == [MechanismName.AUTO]


def test_no_mechanism_is_nothing_in_particular() -> None:
    for name in (None, "", "evict"):
        cls = kind(name)
        assert cls is Mechanism
        assert not (cls.closes_gate or cls.in_process or cls.holds_driver_lock)


def test_the_daemon_compares_no_mechanism_name() -> None:
    """A comparison with a mechanism's name in daemon/ would bring back the string checks."""
    found = []
    for path in sorted(DAEMON_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, ast.Tuple) else [side]
                for value in values:
                    if isinstance(value, ast.Constant) and value.value in MechanismName.texts():
                        found.append(f"{path.name}:{node.lineno} compares with {value.value!r}")
    assert not found, "; ".join(found)
