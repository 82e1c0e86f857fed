"""The rows of ``gpreempt selftest`` and how they are shown (a table of 80 columns, or JSON)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass

WORKS, FAILS, UNPROVEN = "works", "FAILS", "unproven"


@dataclass
class Row:
    mechanism: str
    verdict: str = UNPROVEN
    stopped: bool | None = None
    resumed: bool | None = None
    #: Steps launched but not executed while the GPU stood still (work it held back).
    pending: int | None = None
    #: Queues the kfd tracer held.
    queues: int | None = None
    suspend_ms: float | None = None
    #: From asking for the suspension until the job's last progress seen (what it had queued
    #: draining; the call itself included); None where it never stopped or was not held.
    drain_ms: float | None = None
    #: Steps the job completed in that time (for signal, steps its CPU launched).
    drained: int | None = None
    note: str = ""

    @property
    def works(self) -> bool:
        return self.verdict == WORKS


@dataclass
class Machine:
    gpu: str  # "nvidia", "amd" or ""
    torch: bool

    def describe(self) -> str:
        kind = {"nvidia": "NVIDIA GPU", "amd": "AMD GPU (/dev/kfd)"}.get(self.gpu, "no GPU")
        return f"{kind}, {'with' if self.torch else 'without'} PyTorch"


def duration(ms: float | None) -> str:
    """``9 ms``, ``0.58 s``; ``-`` for none."""
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1e3:.2f} s"


def report(rows: list[Row], machine: Machine, as_json: bool) -> None:
    """Print the rows: JSON (every field), or a table whose ``drain`` column says how long the
    job went on after the suspension was asked (the suspend call's own time is in the JSON)."""
    if as_json:
        listed = [asdict(r) | {"works": r.works} for r in rows]
        print(json.dumps({"machine": machine.describe(), "rows": listed}))
        return
    from rich.console import Console
    from rich.table import Table

    width = min(80, shutil.get_terminal_size((80, 24)).columns)
    table = Table(title=f"gpreempt selftest: {machine.describe()}", title_justify="left")
    for column in ("mechanism", "result", "stops", "resumes", "drain", "note"):
        table.add_column(column, overflow="fold")

    def mark(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "NO")

    for r in rows:
        drain = duration(r.drain_ms)
        table.add_row(r.mechanism, r.verdict, mark(r.stopped), mark(r.resumed), drain, r.note)
    Console(width=width).print(table)
