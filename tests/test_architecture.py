"""The daemon's ownership rules, and the sizes every module and class keeps.

- A task is three parts with one writer each: its identity is frozen; its state record is
  replaced by task_state.py alone; its counters are written by the executor alone (apply.py,
  apply_memory.py).
- What to do is decided by pure functions (the plan modules) that import none of the daemon's
  modules that act (I/O, clocks, threads), only other plan modules, the policies and the names.
- No module of ``src/`` is over 400 lines, no class over 300.

The sources are read with ``ast``; nothing is imported but the task's parts, to read their
fields.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from gpreempt.daemon.task import Task
from gpreempt.daemon.task_counters import TaskCounters
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.daemon.task_state import StateRecord

SRC_DIR = Path(__file__).resolve().parent.parent / "src"
DAEMON_DIR = SRC_DIR / "gpreempt" / "daemon"
#: The modules that decide: pure functions of frozen facts.
PLAN_MODULES = ("plan.py", "backstop_plan.py", "memory_plan.py")
#: The modules that write a task's counters: the executor's.
COUNTER_WRITERS = ("apply.py", "apply_memory.py")
#: What a plan module may import besides other plan modules.
PURE_IMPORTS = ("__future__", "collections", "dataclasses", "typing", "enum", "math")
#: The parts of the package a plan module may import (the daemon's plan modules aside).
PURE_PARTS = ("gpreempt.names", "gpreempt.policy", "gpreempt.protocol")
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300

COUNTERS = {f.name for f in dataclasses.fields(TaskCounters)}
STATE_FIELDS = {f.name for f in dataclasses.fields(StateRecord)}


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def part_writers(source: str, where: str) -> list[str]:
    """Each write in ``source`` of a task's identity, state record or counters, as
    ``where:line what`` (a class's own attributes, ``self.x``, are its own)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            if not isinstance(target, ast.Attribute) or _is_self(target.value):
                continue
            name, owner = target.attr, target.value
            line = f"{where}:{target.lineno}"
            if name == "identity":
                found.append(f"{line} replaces an identity")
            elif name == "state_record" or name in STATE_FIELDS:
                found.append(f"{line} writes a state ({name})")
            elif name == "counters":
                found.append(f"{line} replaces counters")
            elif name in COUNTERS:
                on_counters = isinstance(owner, ast.Attribute) and owner.attr == "counters"
                found.append(f"{line} writes a counter ({name})" + ("" if on_counters else "!"))
    return found


def _daemon_sources() -> list[tuple[str, str]]:
    return [(p.name, p.read_text()) for p in sorted(DAEMON_DIR.glob("*.py"))]


def test_a_tasks_identity_is_frozen_and_read_only() -> None:
    assert dataclasses.fields(TaskIdentity)  # a dataclass
    assert TaskIdentity.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert StateRecord.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for name in ("task_id", "pid", "uid", "name", "priority", "mechanism", "state"):
        prop = getattr(Task, name)
        assert isinstance(prop, property) and prop.fset is None, name
    writers = [line for name, text in _daemon_sources() for line in part_writers(text, name)]
    assert [line for line in writers if "identity" in line] == []


def test_only_task_state_writes_a_tasks_state() -> None:
    found = [
        line
        for name, text in _daemon_sources()
        if name != "task_state.py"
        for line in part_writers(text, name)
        if "state" in line
    ]
    assert found == []


def test_only_the_executor_writes_a_tasks_counters() -> None:
    found = [
        line
        for name, text in _daemon_sources()
        for line in part_writers(text, name)
        if "counter" in line and (name not in COUNTER_WRITERS or line.endswith("!"))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("task.state_record = record\n", "writes a state (state_record)"),
        ("task.suspend_error = None\n", "writes a state (suspend_error)"),
        ("task.counters.preemptions += 1\n", "writes a counter (preemptions)"),
        ("task.turns += 1\n", "writes a counter (turns)!"),
        ("task.identity = other\n", "replaces an identity"),
    ],
)
def test_the_part_check_finds_a_writer(source: str, expected: str) -> None:
    assert any(line.endswith(expected) for line in part_writers(source, "x.py"))


def test_a_class_may_keep_attributes_named_like_counters() -> None:
    assert part_writers("self.turns = Counter()\n", "prometheus.py") == []


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute names of the modules ``node`` (of a module of the daemon) imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.level:
        return [node.module or ""]
    base = "gpreempt.daemon" if node.level == 1 else "gpreempt"
    if node.module is None:  # from . import registry
        return [f"{base}.{alias.name}" for alias in node.names]
    return [f"{base}.{node.module}"]


def _pure(name: str) -> bool:
    """Whether a plan module may import module ``name``."""
    if name.startswith("gpreempt.daemon."):
        return f"{name.rsplit('.', 1)[1]}.py" in PLAN_MODULES
    if name.split(".")[0] == "gpreempt":
        return name.startswith(PURE_PARTS)
    return name.split(".")[0] in PURE_IMPORTS


def impure_imports(source: str, where: str) -> list[str]:
    """Each import in ``source`` that a plan module may not make."""
    return [
        f"{where}:{node.lineno} imports {name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in _imported(node)
        if not _pure(name)
    ]


def test_plan_modules_import_nothing_that_acts() -> None:
    found = [
        line
        for name in PLAN_MODULES
        for line in impure_imports((DAEMON_DIR / name).read_text(), name)
    ]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "import time\n",
        "from ..mechanisms import kind\n",
        "from .memory import MemoryProbe\n",
        "from . import registry\n",
        "import os.path\n",
    ],
)
def test_the_purity_check_finds_an_import_that_acts(source: str) -> None:
    assert impure_imports(source, "plan.py")


def test_the_purity_check_lets_plans_read_plans_policies_and_names() -> None:
    source = (
        "from collections.abc import Sequence\nfrom ..names import MechanismName\n"
        "from ..policy.watch import watch_lists\nfrom .backstop_plan import HoldFacts\n"
    )
    assert impure_imports(source, "plan.py") == []


def oversized(source: str, where: str) -> list[str]:
    """The module of ``source`` if over :data:`MAX_MODULE_LINES`, and each class of it over
    :data:`MAX_CLASS_LINES` (Python)."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{where}: {lines} lines")
    if where.endswith(".py"):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.append(f"{where}: class {node.name} {size} lines")
    return found


def test_no_module_or_class_is_too_long() -> None:
    paths = [p for pattern in ("*.py", "*.cpp", "*.h") for p in SRC_DIR.rglob(pattern)]
    found = [line for p in sorted(paths) for line in oversized(p.read_text(), str(p))]
    assert found == []


def test_the_size_check_finds_a_long_class() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_CLASS_LINES))
    assert oversized(f"class Big:\n{body}", "big.py") == ["big.py: class Big 301 lines"]
