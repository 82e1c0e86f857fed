"""Mechanism and policy names live in one place each, so that a new one touches only its own
module, its name (``gpreempt/names.py``), its registry entry and its tests.

The registries (``mechanisms.KINDS``, ``policy.factory.POLICIES``) hold one entry per name and
no other. And no module of ``src/`` spells a name as a string: code that means a mechanism or
a policy says ``MechanismName.X`` or ``PolicyName.X`` (a typo then fails on import, not in a
running daemon), and code that asks what a mechanism can do asks its capabilities
(``mechanisms.kind(name)``). The sources are read with ``ast``; docstrings do not count, and
:data:`HOMONYMS` lists the strings that spell a name but mean something else.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpreempt.errors import UsageError
from gpreempt.mechanisms import KINDS, Mechanism, MechanismSet
from gpreempt.names import MechanismName, PolicyName
from gpreempt.policy.factory import POLICIES, STRICT_PRIORITY, get_policy, make_policy

SRC_DIR = Path(__file__).resolve().parent.parent / "src"
NAMES_MODULE = "gpreempt.names"
SPELLED = {name.value for name in (*MechanismName, *PolicyName)}

#: (module, text): a string that spells a name and means something else, with what it means.
HOMONYMS: dict[tuple[str, str], str] = {
    ("gpreempt.cli.queues", "auto"): "--vendor auto: whichever GPU vendor is present",
    ("gpreempt.daemon.task", "gate"): "the status field that describes the task's gate",
    ("gpreempt.cli.top", "gate"): "that status field, read",
    ("gpreempt.cli.status", "gate"): "that status field, read",
    ("gpreempt.cli.selftest", "gate"): "that status field, read",
    ("gpreempt.bench.http_server", "auto"): "a server whose requests gpreempt marks by itself",
    ("gpreempt.bench.servers", "auto"): "that server",
    ("gpreempt.cli.queues", "kfd"): "/dev/kfd, the AMD GPU device node",
    ("gpreempt.bench.workloads", "gate"): "a workload's field of gate counters",
    ("gpreempt.bench.scenario_metrics", "gate"): "that field, read",
    ("gpreempt.client.gate.build", "lock"): "the build directory's lock file",
    ("gpreempt.client.launcher", "signal"): "the selector key of the launcher's signal pipe",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC_DIR).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of ``tree`` (module, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled_names(source: str, module: str) -> list[str]:
    """Each string of ``source`` (the text of ``module``) that spells a mechanism or policy
    name outside the names module and :data:`HOMONYMS`, as ``module:line 'text'``."""
    if module == NAMES_MODULE:
        return []
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    return [
        f"{module}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in SPELLED
        and id(node) not in docstrings
        and (module, node.value) not in HOMONYMS
    ]


def test_every_mechanism_name_has_its_class_and_no_class_is_unnamed() -> None:
    assert set(KINDS) == set(MechanismName)
    for name, cls in KINDS.items():
        assert cls.name is MechanismName(name)


def test_every_policy_name_has_its_policy_and_no_policy_is_unnamed() -> None:
    assert set(POLICIES) == set(PolicyName)
    assert set(STRICT_PRIORITY) <= set(PolicyName)
    for name in PolicyName:
        assert make_policy(name).name is name


def test_no_module_spells_a_name_but_the_names_module() -> None:
    found = [
        line
        for path in sorted(SRC_DIR.rglob("*.py"))
        for line in spelled_names(path.read_text(), _module_name(path))
    ]
    assert not found, "say MechanismName.X or PolicyName.X instead: " + "; ".join(found)


def test_every_homonym_is_still_there() -> None:
    """A homonym whose string went away leaves the list: it would hide a real spelling."""
    sources = {_module_name(p): p.read_text() for p in SRC_DIR.rglob("*.py")}
    for module, text in HOMONYMS:
        tree = ast.parse(sources[module])
        assert any(isinstance(n, ast.Constant) and n.value == text for n in ast.walk(tree)), (
            module,
            text,
        )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('if task.mechanism == "kfd":\n    pass\n', "'kfd'"),
        ('def f(policy: str = "hpf") -> None:\n    """About hpf."""\n', "'hpf'"),
        ('mechanisms.get("signal")\n', "'signal'"),
        ('CHOICES = ("gate", "lock")\n', "'gate'"),
    ],
)
def test_the_check_finds_a_spelled_name(source: str, expected: str) -> None:
    """Not vacuous: a planted name is found, wherever it stands."""
    found = spelled_names(source, "gpreempt.daemon.example")
    assert any(expected in line for line in found), found


def test_a_docstring_that_names_one_is_not_a_spelling() -> None:
    assert spelled_names('"""The gate."""\n', "gpreempt.daemon.example") == []
    assert spelled_names('"gate"\n', "gpreempt.daemon.example") == []  # a module docstring


def test_a_name_is_its_text_on_the_wire_and_in_messages() -> None:
    name = MechanismName.GATE
    assert name == "gate" and hash(name) == hash("gate")
    assert str(name) == f"{name}" == "gate" and repr(name) == "'gate'"
    assert json.dumps({name: name}) == '{"gate": "gate"}'
    assert {"gate": 1}[name] == 1 and KINDS["gate"] is KINDS[name]


def test_an_unknown_name_is_one_clear_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown mechanism 'lok': choose one of auto, gate"):
        MechanismName.parse("lok", "mechanism")
    with pytest.raises(UsageError, match="unknown policy 'fifo': choose one of hpf, share"):
        get_policy("fifo")


def test_the_daemon_builds_every_mechanism_from_the_registry_alone() -> None:
    """What this machine lacks is left out with its reason; the rest is built by name."""
    mechanisms = MechanismSet()
    for name in MechanismName:
        if name in mechanisms.unavailable:
            with pytest.raises(Exception, match=f"mechanism '{name}' is not available"):
                mechanisms.get(name)
        else:
            built = mechanisms.get(name)
            assert isinstance(built, Mechanism) and built.name is name
    assert set(mechanisms.concrete) | set(mechanisms.choosing) | set(mechanisms.unavailable) == (
        set(MechanismName)
    )
