"""``gpreempt top``: a live view of GPUs, tasks, priorities, states and preemptions.

GPU utilisation and memory come from NVML, tasks from the daemon's status. ``--once``
prints one frame and exits (for scripts and logs).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..errors import UsageError
from . import add_runtime_dir
from .status import state_label


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
) -> Any:
    """One frame (a rich renderable) from the daemon's status and an NVML snapshot."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ..monitor.textfmt import num, short, size
    from ..nvml import NA

    parts: list[Any] = []
    stamp = time.strftime("%H:%M:%S", time.localtime(now if now is not None else time.time()))
    if status is not None:
        d = status.get("daemon", {})
        header = f"gpreempt top  {stamp}  daemon pid {d.get('pid')}  policy {d.get('policy')}"
    else:
        header = f"gpreempt top  {stamp}  no daemon ({daemon_reason})"
    parts.append(Text(header, style="bold"))

    gpus = Table(title="GPUs", title_justify="left", expand=False)
    for col in ("gpu", "name", "util %", "mem util %", "memory", "processes"):
        gpus.add_column(col, justify="left" if col == "name" else "right")
    if snapshot.unavailable:
        parts.append(Text(f"NVML unavailable: {snapshot.unavailable}"))
    for g in snapshot.gpus:
        procs = g.processes
        gpus.add_row(
            str(g.index),
            str(g.name) if not isinstance(g.name, NA) else "n/a",
            num(None if isinstance(g.util_gpu, NA) else g.util_gpu),
            num(None if isinstance(g.util_memory, NA) else g.util_memory),
            f"{size(g.memory_used)} / {size(g.memory_total)}",
            "n/a" if isinstance(procs, NA) else str(len(procs)),
        )
    if snapshot.gpus:
        parts.append(gpus)

    if status is not None:
        tasks = Table(title="tasks", title_justify="left", expand=False)
        for col in (
            "id",
            "name",
            "pid",
            "priority",
            "gpus",
            "mechanism",
            "state",
            "active",
            "preemptions",
            "suspended s",
            "last suspend ms",
            "gate waits",
        ):
            tasks.add_column(
                col, justify="left" if col in ("name", "state", "mechanism") else "right"
            )
        ordered = sorted(
            status.get("tasks", []), key=lambda t: (-int(t.get("priority", 0)), t.get("task_id", 0))
        )
        for t in ordered:
            gate = t.get("gate") or {}
            state = str(t.get("state", "?"))
            style = {"suspended": "yellow", "held": "magenta", "evicted": "red"}.get(state, "")
            shown = state_label(t)
            tasks.add_row(
                num(t.get("task_id")),
                short(str(t.get("name", "")), 24),
                num(t.get("pid")),
                str(t.get("priority_name") or t.get("priority")),
                ",".join(str(x) for x in t.get("gpus", [])),
                str(t.get("last_mechanism") or t.get("mechanism") or "-"),
                (f"[{style}]{shown}[/]" if style else shown),
                "yes" if t.get("active") else "no",
                num(t.get("preemptions")),
                num(t.get("suspended_seconds"), 2),
                num(t.get("last_suspend_ms"), 2),
                num(gate.get("waits")) if gate else "-",
            )
        if ordered:
            parts.append(tasks)
        else:
            parts.append(Text("no registered tasks"))
    return Group(*parts)


def _frame(runtime_dir: Any, nv: Any) -> Any:
    from .. import nvml
    from ..monitor.daemon_view import fetch_status

    status, reason = fetch_status(runtime_dir, timeout=1.0)
    if isinstance(nv, nvml.NA):
        snap = nvml.NvmlSnapshot([], unavailable=nv.reason)
    else:
        snap = nv.snapshot()
    return build_frame(status, reason, snap)


def run(args: argparse.Namespace) -> int:
    from .. import nvml
    from ..monitor.textfmt import console

    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0 seconds, got {args.interval}")
    con = console()
    nv = nvml.open_nvml()
    try:
        if args.once:
            con.print(_frame(args.runtime_dir, nv))
            return 0
        from rich.live import Live

        with Live(_frame(args.runtime_dir, nv), console=con, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(_frame(args.runtime_dir, nv), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        if not isinstance(nv, nvml.NA):
            nv.close()
