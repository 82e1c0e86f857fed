"""``gpreempt top``: a live view of GPUs, tasks, priorities, states and preemptions.

GPU utilisation and memory come from NVML, tasks from the daemon's status.
``--once`` prints one frame and exits (for scripts and logs): 0 if a daemon
answered, 1 if none did. Without a terminal, frames follow each other.
Tables fit the terminal's width (``$COLUMNS`` when not on a terminal): on
narrow ones the least important columns are left out.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..errors import UsageError
from . import EXIT_FAILURE, EXIT_OK, add_runtime_dir


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of GPUs and gpreempt tasks",
        description=__doc__.replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between frames"
    )
    add_runtime_dir(parser)
    parser.set_defaults(func=run)


def build_frame(
    status: dict[str, Any] | None,
    daemon_reason: str | None,
    snapshot: Any,
    now: float | None = None,
    width: int = 160,
) -> Any:
    """One frame (a rich renderable) from the daemon's status and an NVML snapshot, its tables
    fitted to ``width`` columns (the least important columns go first)."""
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    from ..monitor.textfmt import Column, fit_table, num, pid, short, size
    from ..nvml import NA
    from .status import never_active_lines, styled_state, unprotected_lines

    parts: list[Any] = []
    stamp = time.strftime("%H:%M:%S", time.localtime(now if now is not None else time.time()))
    if status is not None:
        d = status.get("daemon", {})
        header = f"gpreempt top  {stamp}  daemon pid {d.get('pid')}  policy {d.get('policy')}"
    else:
        header = f"gpreempt top  {stamp}  no daemon ({daemon_reason})"
    parts.append(Text(header, style="bold"))

    if snapshot.unavailable:
        parts.append(Text(f"NVML unavailable: {snapshot.unavailable}"))
    gpu_rows = []
    for g in snapshot.gpus:
        procs = g.processes
        gpu_rows.append(
            [
                str(g.index),
                escape(str(g.name)) if not isinstance(g.name, NA) else "n/a",
                num(None if isinstance(g.util_gpu, NA) else g.util_gpu),
                num(None if isinstance(g.util_memory, NA) else g.util_memory),
                f"{size(g.memory_used)} / {size(g.memory_total)}",
                "n/a" if isinstance(procs, NA) else str(len(procs)),
            ]
        )
    if gpu_rows:
        gpu_columns = [
            Column("gpu", "right"),
            Column("name", rank=2),
            Column("util %", "right"),
            Column("mem util %", "right", rank=3),
            Column("memory", "right", rank=1),
            Column("procs", "right", rank=4),
        ]
        parts.append(fit_table(gpu_columns, gpu_rows, width, title="GPUs"))

    if status is not None:
        ordered = sorted(
            status.get("tasks", []), key=lambda t: (-int(t.get("priority", 0)), t.get("task_id", 0))
        )
        rows = []
        for t in ordered:
            gate = t.get("gate") or {}
            rows.append(
                [
                    pid(t.get("task_id")),
                    short(str(t.get("name", "")), 24),
                    pid(t.get("pid")),
                    str(t.get("priority_name") or t.get("priority")),
                    ",".join(str(x) for x in t.get("gpus", [])),
                    str(t.get("last_mechanism") or t.get("mechanism") or "-"),
                    styled_state(t),
                    "yes" if t.get("active") else "no",
                    num(t.get("preemptions")),
                    num(t.get("suspended_seconds"), 2),
                    num(t.get("last_suspend_ms"), 2),
                    num(gate.get("waits")) if gate else "-",
                ]
            )
        columns = [
            Column("id", "right", rank=6),
            Column("name"),
            Column("pid", "right"),
            Column("priority", rank=2),
            Column("gpu", "right", rank=3),
            Column("mechanism", rank=5),
            Column("state"),
            Column("active", rank=4),
            Column("preempted", "right", rank=3),
            Column("suspended s", "right", rank=2),
            Column("last ms", "right", rank=7),
            Column("gate waits", "right", rank=8),
        ]
        if ordered:
            parts.append(fit_table(columns, rows, width, title="tasks"))
            notes = unprotected_lines(ordered) + never_active_lines(ordered)
            parts.extend(Text.from_markup(line) for line in notes)
        else:
            parts.append(Text("no registered tasks"))
    return Group(*parts)


def _frame(runtime_dir: Any, nv: Any, width: int) -> tuple[Any, bool]:
    """The next frame, and whether a daemon answered."""
    from .. import nvml
    from ..monitor.daemon_view import fetch_status

    status, reason = fetch_status(runtime_dir, timeout=1.0)
    if isinstance(nv, nvml.NA):
        snap = nvml.NvmlSnapshot([], unavailable=nv.reason)
    else:
        snap = nv.snapshot()
    return build_frame(status, reason, snap, width=width), status is not None


def run(args: argparse.Namespace) -> int:
    from .. import nvml
    from ..monitor.textfmt import console

    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0 seconds, got {args.interval}")
    con = console()
    nv = nvml.open_nvml()
    try:
        if args.once:
            frame, answered = _frame(args.runtime_dir, nv, con.width)
            con.print(frame)
            return EXIT_OK if answered else EXIT_FAILURE
        frame, _ = _frame(args.runtime_dir, nv, con.width)
        if not con.is_terminal:  # a pipe or a log: one frame after another, as they come
            while True:
                con.print(frame)
                con.print()
                con.file.flush()
                time.sleep(args.interval)
                frame = _frame(args.runtime_dir, nv, con.width)[0]
        from rich.live import Live

        with Live(frame, console=con, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(_frame(args.runtime_dir, nv, con.width)[0], refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        if not isinstance(nv, nvml.NA):
            nv.close()
