"""Small formatting helpers shared by the monitoring commands' tables."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
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


def console(file: Any = None, width: int | None = None) -> Any:
    """A rich Console: ``width``, else the terminal's width on a terminal, else ``$COLUMNS``,
    else 160 columns when piped."""
    from rich.console import Console

    out = file if file is not None else sys.stdout
    tty = hasattr(out, "isatty") and out.isatty()
    if width is None and not tty:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else 160
    return Console(file=out, width=width, highlight=False, soft_wrap=False, emoji=False)


@dataclass(frozen=True)
class Column:
    """A table column and how much it matters when the terminal is narrow."""

    header: str
    justify: str = "left"
    #: Columns of larger rank are dropped first when the table does not fit (0 = never).
    rank: int = 0


def fit_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    width: int,
    title: str = "",
    gap: int = 0,
) -> Any:
    """A rich Table of ``rows`` (cells as rich markup) no wider than ``width``: columns of the
    highest rank are dropped, one at a time, until the rest fit, so that what remains is
    shown whole instead of cut to "…". Columns of rank 0 are always kept. ``gap``: 0 draws
    a box; more, no box, ``gap`` spaces between columns and the headers underlined (the
    narrowest table, for the columns that must fit 80)."""
    from rich.table import Table
    from rich.text import Text

    widths = [
        max([len(c.header), *(Text.from_markup(str(r[i])).cell_len for r in rows)])
        for i, c in enumerate(columns)
    ]
    keep = list(range(len(columns)))

    def total() -> int:  # a box table: one border per column plus one, a space each side
        if gap:
            return sum(widths[i] for i in keep) + gap * (len(keep) - 1)
        return sum(widths[i] + 3 for i in keep) + 1

    for rank in sorted({c.rank for c in columns if c.rank > 0}, reverse=True):
        for i in [i for i in reversed(keep) if columns[i].rank == rank]:
            if total() <= width:
                break
            keep.remove(i)
    table = Table(title=title or None, title_justify="left", expand=False)
    if gap:
        table = Table(
            title=title or None,
            title_justify="left",
            expand=False,
            box=None,
            padding=(0, gap, 0, 0),
            pad_edge=False,
            header_style="bold underline",
        )
    for i in keep:
        table.add_column(columns[i].header, justify=columns[i].justify, no_wrap=True)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def pid(x: Any) -> str:
    """A process id or task id: digits as they are (no thousands separator), '-' for None."""
    return "-" if x is None else str(x)
