"""``gpreempt status``: every task per GPU, with its state and preemption counters."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..client.connection import DaemonClient
from ..names import MechanismName
from . import add_runtime_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show tasks per GPU with state and preemption counters",
        description="Show every registered task per GPU: pid, name, priority, state, what "
        "marks it active, mechanism, preemptions, total time suspended, last suspend latency.",
    )
    add_runtime_dir(parser)
    parser.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with DaemonClient.connect(args.runtime_dir) as client:
        reply = client.status()
    if args.json:
        reply.pop("ok", None)
        print(json.dumps(reply, indent=2))
        return 0
    print_status(reply)
    return 0


def state_label(task: dict[str, Any]) -> str:
    """A task's state as the tables show it, marking a wait for a peer's turn."""
    return str(task.get("state", "?")) + (" (turn)" if task.get("waiting_turn") else "")


def print_status(reply: dict[str, Any], console: Any = None) -> None:
    """The status as tables per GPU, fitted to the console's width (narrow terminals lose
    the least important columns first), then one line per unprotected task with why."""
    from rich.markup import escape

    from ..monitor.textfmt import Column, fit_table, pid
    from ..monitor.textfmt import console as make_console

    console = console or make_console()
    daemon = reply["daemon"]
    console.print(
        f"daemon pid {daemon['pid']}, policy {daemon['policy']}"
        + (f" (peers take {daemon['turn_ms']:g} ms turns)" if daemon.get("turn_ms") else "")
        + f", {escape(str(daemon['runtime_dir']))}"
    )
    if not daemon.get("lock_available"):
        console.print("(driver lock unavailable: signal/gate only)")
    failed = (daemon.get("event_write_failures") or 0) + (daemon.get("state_write_failures") or 0)
    if failed:
        console.print(
            f"[yellow]{failed} writes to the runtime directory failed[/yellow] "
            f"(last: {escape(str(daemon.get('last_write_error')))}); the daemon goes on"
        )
    tasks = reply["tasks"]
    if not tasks:
        console.print("no tasks registered")
        return
    evictions = any(t.get("evicted_bytes") for t in tasks)
    turns = any(t.get("turns") for t in tasks)
    columns = [
        Column("pid", "right"),
        Column("name"),
        Column("prio", rank=2),
        Column("state"),
        # and what says when it is: a server framework's requests (asgi, grpc), request(), its
        # launches, always
        Column("active/by", rank=4),
        Column("mechanism", rank=5),
        Column("preempted", "right", rank=3),
        Column("suspended s", "right", rank=3),
        Column("last ms", "right", rank=6),
    ]
    if turns:
        columns.append(Column("turns waited", "right", rank=7))
    if evictions:
        columns.append(Column("on host GiB", "right", rank=6))
    gpus = sorted({g for t in tasks for g in t["gpus"]})
    for gpu in gpus:
        rows = []
        for task in sorted(tasks, key=lambda t: -t["priority"]):
            if gpu not in task["gpus"]:
                continue
            last = task["last_suspend_ms"]
            mechanism = mechanism_label(task)
            extra = [str(task.get("turns") or 0)] if turns else []
            if evictions:
                moved = task.get("evicted_bytes") or 0
                extra.append(f"{moved / 2**30:.2f}" if task["state"] == "evicted" else "-")
            rows.append(
                [
                    pid(task["pid"]),
                    escape(task["name"]) + job_note(task),
                    task["priority_name"],
                    styled_state(task),
                    ("yes" if task["active"] else "no") + "/" + str(task.get("marker") or "-"),
                    mechanism,
                    str(task["preemptions"]),
                    f"{task['suspended_seconds']:.3f}",
                    "-" if last is None else f"{last:.3f}",
                    *extra,
                ]
            )
        console.print(fit_table(columns, rows, console.width, title=f"GPU {gpu}", gap=1))
    for line in unprotected_lines(tasks) + leak_lines(tasks) + never_active_lines(tasks):
        console.print(line)


def mechanism_label(task: dict[str, Any]) -> str:
    """The mechanism as the table shows it: the one that last suspended the task for ``auto``
    (``gate``), both where it differs from a forced one (``lock (signal)``)."""
    mechanism, last = task["mechanism"], task.get("last_mechanism")
    if not last or last == mechanism:
        return mechanism
    return last if mechanism == MechanismName.AUTO else f"{mechanism} ({last})"


def job_note(task: dict[str, Any]) -> str:
    """What follows the name of a task on several GPUs or of several processes (the ranks of
    a multi-GPU job), e.g. `` (GPUs 0,1; 3 processes)``: such a task appears under each of its
    GPUs and stops as a whole."""
    parts = []
    if len(task["gpus"]) > 1:
        parts.append("GPUs " + ",".join(map(str, task["gpus"])))
    if (task.get("processes") or 0) > 1:
        parts.append(f"{task['processes']} processes")
    return f" ({'; '.join(parts)})" if parts else ""


def styled_state(task: dict[str, Any]) -> str:
    """The state label as rich markup, coloured where it needs attention."""
    state = str(task.get("state", "?"))
    style = {
        "suspended": "yellow",
        "held": "magenta",
        "evicted": "red",
        "unprotected": "bold red",
    }.get(state, "")
    shown = state_label(task)
    return f"[{style}]{shown}[/]" if style else shown


def unprotected_lines(tasks: list[dict[str, Any]]) -> list[str]:
    """One line (rich markup) per task the policy wants suspended and could not suspend."""
    from rich.markup import escape

    return [
        f"[bold red]unprotected[/]: {escape(t['name'])} (pid {t['pid']}) keeps running beside "
        f"more important tasks on GPU {','.join(map(str, t['gpus']))}: "
        f"{escape(str(t.get('suspend_error')))}"
        for t in tasks
        if t.get("state") == "unprotected"
    ]


def leak_lines(tasks: list[dict[str, Any]]) -> list[str]:
    """One line (rich markup) per task whose suspension was found not to hold: its gate's
    words no longer count, and the driver lock or signals back it up."""
    from rich.markup import escape

    lines = []
    for task in tasks:
        gate = task.get("gate") or {}
        if gate.get("trusted", True) and not gate.get("barrier_leaks"):
            continue
        found = []
        if gate.get("hold_leaks"):
            found.append(f"{gate['hold_leaks']} suspension(s) did not hold")
        if gate.get("barrier_leaks"):
            found.append(
                f"its GPU work passed its stream barriers {gate['barrier_leaks']} time(s) while "
                "a more important task stayed active"
            )
        lines.append(
            f"[bold red]not held[/]: {escape(task['name'])} (pid {task['pid']}): "
            + ("; ".join(found) or "its gate was found not to hold")
            + "; its gate is trusted no more: the driver lock or signals back it up "
            "(`gpreempt events`)"
        )
    return lines


def never_active(task: dict[str, Any]) -> bool:
    """Whether a task has never counted as active: not ``--always-active``, not active now,
    and neither a GPU launch nor a ``request()`` seen in it (an attached process without
    PyTorch or the in-process client, or one whose gates could not load, shows neither)."""
    if task.get("always_active") or task.get("active"):
        return False
    gate = task.get("gate") or {}
    return not gate.get("launches") and not gate.get("requests")


def never_active_lines(tasks: list[dict[str, Any]]) -> list[str]:
    """One line per task that never counted as active while a less important task shares
    one of its GPUs: it suspends nobody until it does, and the line says how it would."""
    from rich.markup import escape

    lines = []
    for task in tasks:
        below = [
            t
            for t in tasks
            if t["priority"] < task["priority"] and set(t["gpus"]) & set(task["gpus"])
        ]
        if below and never_active(task):
            lines.append(
                f"[yellow]{escape(task['name'])}[/]: never active: no GPU launch seen; "
                "mark requests or --always-active"
            )
    return lines
