"""Small formatting helpers shared by the monitoring commands' tables."""

from __future__ import annotations

import sys
from typing import Any


def short(name: str, width: int = 70) -> str:
    """A long (C++ template) name cut to ``width`` characters, escaped for rich markup."""
    from rich.markup import escape

    return escape(name if len(name) <= width else name[: width - 1] + "…")


def plain(text: Any) -> str:
    """Any text from logs or processes, escaped so rich shows it as is."""
    from rich.markup import escape

    return escape(str(text))


def num(x: Any, digits: int = 1) -> str:
    """A number for a table cell: thousands separators, '-' for None."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    if isinstance(x, (list, tuple)):
        return ", ".join(str(v) for v in x) or "-"
    return str(x)


def size(n: Any) -> str:
    """Bytes as MiB/GiB."""
    if not isinstance(n, (int, float)):
        return "n/a"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def console(file: Any = None) -> Any:
    """A rich Console: the terminal's width on a terminal, a wide fixed width when piped."""
    from rich.console import Console

    out = file if file is not None else sys.stdout
    tty = hasattr(out, "isatty") and out.isatty()
    return Console(
        file=out, width=None if tty else 160, highlight=False, soft_wrap=False, emoji=False
    )
