"""``gpreempt queues``: what runs on the GPUs now, per process and hardware queue.

NVIDIA: compute processes per GPU from NVML (pid, name, memory, SM
utilisation), joined with the daemon's registry (task, priority, state).
AMD: each process's queues from ``/sys/kernel/debug/kfd/mqds`` and the active
hardware queue slots per pipe from ``hqds`` (root only; ``--mqds FILE --hqds
FILE`` read saved copies). A source that cannot be read is named with the
reason, never silently skipped. A machine without a GPU says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import add_runtime_dir


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "queues",
        help="processes and hardware queues on the GPUs now (NVML, KFD debugfs)",
        description=__doc__.replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pid", type=int, help="only this process")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--vendor",
        choices=("auto", "nvidia", "amd"),
        default="auto",
        help="which GPUs to look at (default: both; only AMD when --mqds/--hqds are given)",
    )
    parser.add_argument("--mqds", metavar="FILE", help="a saved copy of .../kfd/mqds")
    parser.add_argument("--hqds", metavar="FILE", help="a saved copy of .../kfd/hqds")
    parser.add_argument(
        "--all-hqds", action="store_true", help="list idle hardware queue slots too"
    )
    add_runtime_dir(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    vendor = args.vendor
    if vendor == "auto" and (args.mqds or args.hqds):
        vendor = "amd"
    doc: dict[str, Any] = {}
    found = gpus_found() if vendor == "auto" else {"nvidia", "amd"}
    if not found:
        reason = "no GPU on this machine (no /dev/nvidia*, no /dev/kfd): nothing runs on one"
        if args.json:
            print(json.dumps({"nvidia": None, "amd": None, "reason": reason}, indent=2))
        else:
            print(reason)
        return 0
    if vendor in ("auto", "nvidia") and "nvidia" in found:
        doc["nvidia"] = nvidia_view(args.runtime_dir, args.pid)
    if vendor in ("auto", "amd") and "amd" in found:
        doc["amd"] = amd_view(args.mqds, args.hqds, args.pid, args.all_hqds)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        _print(doc)
    return 0


def gpus_found(dev: Path = Path("/dev")) -> set[str]:
    """The GPU vendors whose device nodes this machine has: with none, neither NVML nor
    debugfs has anything to tell (and their hints would mislead)."""
    found = set()
    if any(p.name[6:].isdigit() for p in dev.glob("nvidia*")):
        found.add("nvidia")
    if (dev / "kfd").exists():
        found.add("amd")
    return found


def nvidia_view(
    runtime_dir: Any, pid: int | None, nvml_lib: Any = None, status: Any = "fetch"
) -> dict[str, Any]:
    """NVML's processes per GPU joined with the daemon's tasks (JSON-ready)."""
    from .. import nvml
    from ..monitor.daemon_view import fetch_status, tasks_by_pid

    snap = nvml.snapshot(nvml_lib)
    if status == "fetch":
        status, reason = fetch_status(runtime_dir)
    else:
        reason = None if status else "no daemon status given"
    tasks = tasks_by_pid(status)
    doc = snap.to_dict()
    seen: set[int] = set()
    for gpu in doc["gpus"]:
        procs = gpu["processes"]
        if procs is None:
            continue
        if pid is not None:
            gpu["processes"] = procs = [p for p in procs if p["pid"] == pid]
        for p in procs:
            task = tasks.get(p["pid"])
            p["task"] = _task_brief(task) if task else None
            seen.add(p["pid"])
    idle = [
        _task_brief(t)
        for tpid, t in sorted(tasks.items())
        if tpid not in seen and (pid is None or tpid == pid)
    ]
    doc["daemon"] = {"running": status is not None, "reason": reason}
    doc["registered_without_gpu_process"] = idle
    return doc


def _task_brief(task: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "task_id",
        "name",
        "pid",
        "priority",
        "priority_name",
        "state",
        "active",
        "mechanism",
        "gpus",
        "preemptions",
        "suspended_seconds",
    )
    return {k: task.get(k) for k in keys}


def amd_view(
    mqds_file: str | None,
    hqds_file: str | None,
    pid: int | None,
    all_hqds: bool = False,
    debugfs_root: Path | None = None,
) -> dict[str, Any]:
    """Processes with their queues (mqds) and active hardware queues (hqds), JSON-ready."""
    from ..monitor import kfd_debugfs as kfd

    root = debugfs_root or kfd.DEBUGFS_KFD
    out: dict[str, Any] = {}
    live = mqds_file is None and hqds_file is None
    for name, given in (("mqds", mqds_file), ("hqds", hqds_file)):
        if not live and given is None:
            out[name] = {"available": False, "reason": f"not given (--{name} FILE)"}
            continue
        try:
            text = _read_given(given) if given else kfd.read_debugfs(name, root)
        except kfd.SourceUnavailable as exc:
            out[name] = {"available": False, "reason": str(exc)}
            continue
        source = given or str(root / name)
        if name == "mqds":
            view = kfd.parse_mqds(text)
            procs = [p for p in view.processes if pid is None or p.pid == pid]
            out[name] = {
                "available": True,
                "source": source,
                "processes": [p.to_dict() for p in procs],
                "unparsed_lines": view.unparsed_lines,
            }
        else:
            hview = kfd.parse_hqds(text)
            out[name] = {"available": True, "source": source, **hview.to_dict(all_hqds)}
    return out


def _read_given(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def _print(doc: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from ..monitor.textfmt import console, num, size

    con = console()
    nv = doc.get("nvidia")
    if nv is not None:
        con.rule("[bold]NVIDIA")
        if not nv["available"]:
            con.print(f"NVML unavailable: {escape(str(nv['reason']))}")
        for gpu in nv["gpus"]:
            con.print(
                f"[bold]GPU {gpu['index']}[/] {gpu['name'] or 'n/a'}: util "
                f"{num(gpu['util_gpu'])} %, memory {size(gpu['memory_used'])} / "
                f"{size(gpu['memory_total'])}"
            )
            if gpu["processes"] is None:
                con.print(f"  processes: n/a ({gpu['processes_na']})")
                continue
            if not gpu["processes"]:
                con.print("  no compute processes")
                continue
            t = Table()
            for col in (
                "pid",
                "name",
                "memory",
                "SM %",
                "task",
                "priority",
                "state",
                "preemptions",
            ):
                t.add_column(col, justify="left" if col in ("name", "task", "state") else "right")
            for p in gpu["processes"]:
                task = p.get("task") or {}
                t.add_row(
                    str(p["pid"]),
                    p["name"] or "n/a",
                    size(p["used_memory"]),
                    num(p["sm_util"]),
                    task.get("name") or "-",
                    task.get("priority_name") or num(task.get("priority")),
                    task.get("state") or "-",
                    num(task.get("preemptions")),
                )
            con.print(t)
        daemon = nv["daemon"]
        if daemon["running"]:
            idle = nv["registered_without_gpu_process"]
            if idle:
                con.print(
                    "registered tasks with no GPU process now: "
                    + ", ".join(f"{t['name']} (pid {t['pid']}, {t['state']})" for t in idle)
                )
        else:
            con.print(f"[yellow]no daemon:[/] {daemon['reason']}; showing NVML only")
    amd = doc.get("amd")
    if amd is None:
        return
    con.rule("[bold]AMD (KFD debugfs)")
    mq = amd["mqds"]
    if not mq["available"]:
        con.print(f"mqds unavailable: {escape(str(mq['reason']))}")
    else:
        con.print(f"mqds from {mq['source']}: {len(mq['processes'])} process(es)")
        t = Table()
        for col in (
            "pid",
            "pasid",
            "type",
            "device",
            "ring (HWq)",
            "queue prio",
            "pipe prio",
            "vmid",
            "xcc",
        ):
            t.add_column(col, justify="left" if col in ("type", "ring (HWq)") else "right")
        for p in mq["processes"]:
            if not p["queues"]:
                t.add_row(str(p["pid"]), p["pasid"], "(no queues)", "", "", "", "", "", "")
            for q in p["queues"]:
                t.add_row(
                    str(p["pid"]),
                    p["pasid"],
                    q["type"],
                    q["device"],
                    q.get("ring_address") or "-",
                    num(q.get("queue_priority")),
                    num(q.get("pipe_priority")),
                    num(q.get("vmid")),
                    num(q["xcc"]),
                )
        con.print(t)
    hq = amd["hqds"]
    if not hq["available"]:
        con.print(f"hqds unavailable: {escape(str(hq['reason']))}")
        return
    con.print(f"hqds from {hq['source']}")
    for node in hq["nodes"]:
        if node["stopped"]:
            con.print(f"node {node['node']} gpu_id {node['gpu_id']}: [red]device is stopped[/]")
            continue
        per_pipe = ", ".join(f"{k}: {v}" for k, v in node["active_per_pipe"].items() if v)
        con.print(
            f"node {node['node']} gpu_id {node['gpu_id']}: {node['cp_active']} of "
            f"{node['cp_slots']} compute HQDs active ({per_pipe or 'none'}); "
            f"{node['sdma_active']} of {node['sdma_slots']} SDMA queues enabled"
        )
        for h in node["hqds"]:
            if h["kind"] == "sdma":
                con.print(f"   SDMA engine {h['engine']} RLC {h['rlc']}: active {num(h['active'])}")
            else:
                con.print(
                    f"   {h['kind'].upper()} inst {h['inst']} pipe {h['pipe']} queue "
                    f"{h['queue']}: active {num(h['active'])}"
                    + (
                        f", vmid {h.get('vmid')}, queue prio {h.get('queue_priority')}, "
                        f"ring {h.get('ring_address')}"
                        if h["active"]
                        else ""
                    )
                )
    if hq["stopped_devices"]:
        con.print("stopped devices: " + ", ".join(hq["stopped_devices"]))
