"""A record reads top to bottom: every dataclass of ``src/`` declares all its fields before
its first method, so that what it holds is in one place (the sources are read with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC_DIR = Path(__file__).resolve().parent.parent / "src"


def _is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
        if name == "dataclass":
            return True
    return False


def fields_after_methods(source: str, where: str) -> list[str]:
    """Each field of a dataclass of ``source`` declared below one of its methods."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ClassDef) and _is_dataclass(node)):
            continue
        method_seen = None
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                method_seen = method_seen or item.name
            elif isinstance(item, ast.AnnAssign) and method_seen:
                name = getattr(item.target, "id", "?")
                found.append(f"{where}:{item.lineno} {node.name}.{name} after {method_seen}()")
    return found


def test_every_dataclass_declares_its_fields_before_its_methods() -> None:
    found = [
        line
        for path in sorted(SRC_DIR.rglob("*.py"))
        for line in fields_after_methods(path.read_text(), str(path.relative_to(SRC_DIR)))
    ]
    assert found == []


def test_the_check_finds_a_field_below_a_method() -> None:
    source = (
        "@dataclass\nclass Task:\n    pid: int\n    def view(self):\n        pass\n"
        "    attached: bool = False\n"
    )
    assert fields_after_methods(source, "x.py") == ["x.py:6 Task.attached after view()"]
    plain = "class Task:\n    def view(self):\n        pass\n    attached: bool = False\n"
    assert fields_after_methods(plain, "x.py") == []
