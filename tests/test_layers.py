"""The package's layers import one way, and its core never loads torch or NVML on import.

The README states the layering: protocol and the other core modules <- policy <- mechanisms
<- daemon, client <- cli, monitor, bench. This test reads every module's imports
with `ast` (nothing is imported, so it runs without torch or a GPU) and fails, naming the file
and line, when a module imports one of a higher layer, when the daemon and the client import
each other, when a module below the command line imports torch or NVML at module level (the
core must load on a machine with neither), or when anything but `gpreempt.nvml` talks to NVML.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "src" / "gpreempt"

#: Rank of each first-level part of the package; a module may import only its own rank or lower.
LAYERS: dict[str, int] = {
    "errors": 0,
    "priority": 0,
    "config": 0,
    "protocol": 0,
    "control": 0,
    "control_block": 0,
    "procinfo": 0,
    "futex": 0,
    "runtime_dir": 0,
    "nvml": 0,
    "field_checks": 0,
    "messages": 0,
    "names": 0,
    "policy": 1,
    "mechanisms": 2,
    "daemon": 3,
    "client": 3,
    # the ptrace tracer of mechanism kfd, run by the launcher (client/launcher.py)
    "tracer": 3,
    # The public facade (`gpreempt/__init__.py`) re-exports the client, so it sits on top.
    "": 4,
    "__main__": 4,
    "cli": 4,
    "monitor": 4,
    "bench": 4,
}

#: Parts of one rank that must not import each other.
SIBLINGS_APART = {frozenset({"daemon", "client"})}

#: Modules of these parts load on a machine without torch or NVML.
NO_HEAVY_IMPORTS = {name for name, rank in LAYERS.items() if rank <= 3 or name in ("cli", "")}
HEAVY = ("torch", "pynvml")


@dataclass(frozen=True)
class Import:
    """One import statement of a module, resolved to absolute module names."""

    module: str  # the importing module, e.g. "gpreempt.daemon.server"
    target: str  # the imported module, e.g. "gpreempt.policy.hpf" or "torch.nn"
    line: int
    module_level: bool  # False inside a function or class body (imported when called)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "gpreempt":
        return False
    path = PACKAGE_DIR.joinpath(*parts[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> list[Import]:
    return _parse_imports(path.read_text(), _module_name(path), path.name == "__init__.py")


def _parse_imports(source: str, module: str, is_package: bool) -> list[Import]:
    """Every import in `source`, read as the text of `module`."""
    found: list[Import] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(module, a.name, node.lineno, module_level) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            for alias in node.names:
                # `from . import session` imports a module; `from x import name` imports x.
                sub = f"{target}.{alias.name}"
                found.append(
                    Import(module, sub if _is_module(sub) else target, node.lineno, module_level)
                )
        inner = module_level and not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
        )
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), True)
    return found


def _part(name: str) -> str:
    """First-level part of a gpreempt module name: "daemon" for "gpreempt.daemon.server"."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _all_imports() -> list[Import]:
    return [imp for path in sorted(PACKAGE_DIR.rglob("*.py")) for imp in _imports(path)]


def _where(imp: Import) -> str:
    return f"{imp.module} (line {imp.line}) imports {imp.target}"


def layer_violations(imports: list[Import]) -> list[str]:
    """Each import of a higher layer, or between parts kept apart, as one readable line."""
    bad = []
    for imp in imports:
        if not imp.target.startswith("gpreempt"):
            continue
        src, dst = _part(imp.module), _part(imp.target)
        if src not in LAYERS or dst not in LAYERS:
            bad.append(f"{_where(imp)}: a part with no layer; add it to LAYERS")
        elif LAYERS[dst] > LAYERS[src]:
            bad.append(f"{_where(imp)}: {src or 'gpreempt'} may not import the higher {dst}")
        elif frozenset({src, dst}) in SIBLINGS_APART:
            bad.append(f"{_where(imp)}: {src} and {dst} must not import each other")
    return bad


def heavy_import_violations(imports: list[Import]) -> list[str]:
    """Module-level torch/NVML imports in modules that must load without them."""
    bad = []
    for imp in imports:
        heavy = imp.target.split(".")[0] in HEAVY
        if heavy and imp.module_level and _part(imp.module) in NO_HEAVY_IMPORTS:
            bad.append(f"{_where(imp)} at module level: import it where it is used")
        if imp.target.split(".")[0] == "pynvml" and imp.module != "gpreempt.nvml":
            bad.append(f"{_where(imp)}: only gpreempt.nvml talks to NVML")
    return bad


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {_part(_module_name(p)) for p in PACKAGE_DIR.rglob("*.py")}
    assert parts <= LAYERS.keys(), f"give these a layer in LAYERS: {sorted(parts - LAYERS.keys())}"


def test_layers_import_one_way() -> None:
    assert layer_violations(_all_imports()) == []


def test_core_modules_load_without_torch_or_nvml() -> None:
    assert heavy_import_violations(_all_imports()) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("gpreempt.policy.hpf", "from ..daemon import server\n", "may not import the higher"),
        ("gpreempt.protocol", "import gpreempt.client.session\n", "may not import the higher"),
        ("gpreempt.client.api", "from ..daemon.persist import load\n", "must not import"),
        ("gpreempt.daemon.server", "import torch\n", "at module level"),
        (
            "gpreempt.mechanisms.gate",
            "try:\n    import pynvml\nexcept ImportError:\n    pass\n",
            "at module level",
        ),
        ("gpreempt.bench.gpu_sampler", "def f():\n    import pynvml\n", "only gpreempt.nvml"),
    ],
)
def test_the_checks_catch_a_wrong_import(module, source, expected) -> None:
    """The checks are not vacuous: a planted bad import is reported."""
    imports = _parse_imports(source, module, is_package=False)
    lines = layer_violations(imports) + heavy_import_violations(imports)
    assert any(expected in line for line in lines), lines


def test_a_function_level_torch_import_is_allowed() -> None:
    imports = [Import("gpreempt.client.gate", "torch", 10, False)]
    assert heavy_import_violations(imports) == []
