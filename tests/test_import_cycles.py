"""No two modules of the package import each other, directly or through others.

A cycle makes a module impossible to read, test or load on its own, and it is how a
collaborator comes to reach into its owner's private parts. Every import counts here: at
module level, inside a function, and under ``TYPE_CHECKING`` alike (the imports are read with
`ast`; nothing is imported). A package's ``__init__`` importing its own modules is not a cycle
by itself: a module that imports its package's ``__init__`` is read as importing the modules
that ``__init__`` imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "src" / "gpreempt"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _known_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}


def _targets(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules that ``source`` (the text of ``module``) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".") if is_package else module.split(".")[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names] + [target]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules it imports, for ``sources`` (module -> (text, is_package))."""
    known = set(sources)
    return {
        module: _targets(text, module, is_package, known)
        for module, (text, is_package) in sources.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that ends where it starts, or None.

    An edge from a module to a package it lives in (``gpreempt.daemon.x`` importing
    ``gpreempt.daemon``) is not followed: Python loads the package first either way."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if module.startswith(target + "."):
                continue
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    sources = {
        name: (path.read_text(), path.name == "__init__.py")
        for name, path in _known_modules().items()
    }
    cycle = find_cycle(import_graph(sources))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_check_finds_a_cycle_through_a_type_checking_import() -> None:
    """Not vacuous: the cycle the daemon once had (memory imported the server for a type,
    the server imported memory) is found."""
    sources = {
        "gpreempt.daemon": ("", True),
        "gpreempt.daemon.server": ("from .memory import MemoryManager\n", False),
        "gpreempt.daemon.memory": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .server import Daemon\n",
            False,
        ),
        "gpreempt.daemon.registry": ("from . import memory\n", False),
    }
    cycle = find_cycle(import_graph(sources))
    assert cycle is not None
    assert set(cycle) == {"gpreempt.daemon.server", "gpreempt.daemon.memory"}


def test_a_package_importing_its_own_modules_is_not_a_cycle() -> None:
    sources = {
        "gpreempt.policy": ("from .hpf import decide_hpf\n", True),
        "gpreempt.policy.hpf": ("from .snapshot import Snapshot\n", False),
        "gpreempt.policy.snapshot": ("", False),
    }
    assert find_cycle(import_graph(sources)) is None
