"""No two modules of ``src/`` import each other, directly or through others.

A cycle makes a module impossible to read, test or load on its own, and it is how a
collaborator comes to reach into its owner's private parts. Every module under ``src/`` is
read, and every import counts: at module level, inside a function, and under
``TYPE_CHECKING`` alike (the imports are read with `ast`; nothing is imported).

An import depends on what Python runs for it:

- ``from P import name`` (a name that ``P/__init__.py`` defines or re-exports) depends on
  ``P``'s ``__init__``, even where ``P`` is the importer's own package: the name must be
  there when it is read, so a package whose ``__init__`` imports that module is a cycle;
- ``from P import sub`` (a module) depends on ``P.sub``, and on ``P``'s ``__init__`` unless
  ``P`` encloses the importer (Python loaded it before the importer, and needs nothing of it);
- ``import a.b`` depends on ``a.b``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC_DIR = Path(__file__).resolve().parent.parent / "src"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC_DIR).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _known_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC_DIR.rglob("*.py")}


def _known(name: str, known: set[str]) -> str:
    """The longest part of ``name`` that is a module of ``known`` ("" if none)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def _targets(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules that ``source`` (the text of ``module``) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".") if is_package else module.split(".")[:-1]
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            package = _known(target, known)
            encloses = module.startswith(package + ".")
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    found.add(sub)
                    if not encloses:
                        found.add(package)
                else:
                    found.add(package)
    found.discard("")
    found.discard(module)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the modules it imports, for ``sources`` (module -> (text, is_package))."""
    known = set(sources)
    return {
        module: _targets(text, module, is_package, known)
        for module, (text, is_package) in sources.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
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


def test_no_module_of_src_imports_itself_through_others() -> None:
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


def test_a_name_from_the_own_package_that_imports_the_module_is_a_cycle() -> None:
    """The cycle the bench once had read as its worst case: a module reads a name of its
    package's ``__init__``, which imports that module."""
    sources = {
        "gpreempt.bench": ("from .runner import run_bench\nVERSION = 1\n", True),
        "gpreempt.bench.runner": ("from . import VERSION\n", False),
    }
    cycle = find_cycle(import_graph(sources))
    assert cycle is not None and set(cycle) == {"gpreempt.bench", "gpreempt.bench.runner"}


def test_a_module_of_the_own_package_is_no_dependency_on_its_init() -> None:
    """``from . import load`` needs ``load``, not the ``__init__`` that is loading it."""
    sources = {
        "gpreempt.bench": ("from .runner import run_bench\n", True),
        "gpreempt.bench.runner": ("from . import load\n", False),
        "gpreempt.bench.load": ("", False),
    }
    assert import_graph(sources)["gpreempt.bench.runner"] == {"gpreempt.bench.load"}
    assert find_cycle(import_graph(sources)) is None


def test_a_module_of_another_package_depends_on_that_packages_init() -> None:
    sources = {
        "gpreempt.daemon": ("from .server import Daemon\n", True),
        "gpreempt.daemon.server": ("from ..policy import hpf\n", False),
        "gpreempt.policy": ("from ..daemon import server\n", True),
        "gpreempt.policy.hpf": ("", False),
    }
    graph = import_graph(sources)
    assert graph["gpreempt.daemon.server"] == {"gpreempt.policy", "gpreempt.policy.hpf"}
    assert find_cycle(graph) is not None
