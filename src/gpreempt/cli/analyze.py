"""``gpreempt analyze``: what queues and kernels a workload uses, from logs or traces.

* ``gpreempt analyze amd-log FILE [FILE...]``: HIP runtime logs (``AMD_LOG_LEVEL=3..5``),
  plain or gzip, any size; two or more files are compared side by side (Case-A vs Case-B).
* ``gpreempt analyze trace -- script.py ARGS``: run a PyTorch script under torch.profiler and
  report per CUDA/HIP stream; ``--trace FILE`` (repeatable) analyses saved Chrome traces.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import GpreemptError, UsageError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "analyze",
        help="queue and kernel usage from HIP logs or PyTorch traces",
        description=__doc__.replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="analyze_command", metavar="WHAT")

    amd = sub.add_parser(
        "amd-log",
        help="analyse HIP/CLR runtime logs (AMD_LOG_LEVEL=3..5)",
        description=(
            "Per file: processes, hardware queues (HWq) with their software queue, ROCr id and "
            "priority, dispatches per queue, kernels by ShaderName with grid/workgroup sizes, "
            "barrier/acquire/release counts, time span and dispatch rate. Two or more files: "
            "a Case-A vs Case-B comparison. Capture a log with "
            "`AMD_LOG_LEVEL=4 python app.py 2> app.log` (level 3 has kernel names but no "
            "queues; 4 adds the pid, the queue and the packet of every dispatch)."
        ),
    )
    amd.add_argument("files", nargs="+", metavar="FILE", help="log files (.gz accepted)")
    amd.add_argument("--json", action="store_true", help="print JSON instead of tables")
    amd.add_argument("--top", type=int, default=15, help="kernels to list per file (default 15)")
    amd.add_argument(
        "--no-progress", action="store_true", help="no progress bar even on a terminal"
    )
    amd.set_defaults(func=run_amd_log, prog=amd.prog)

    tr = sub.add_parser(
        "trace",
        help="per-stream kernel analysis of a PyTorch workload (torch.profiler)",
        description=(
            "Run a PyTorch script under torch.profiler (`gpreempt analyze trace -- script.py "
            "ARGS`) or read saved Chrome traces (`--trace A.json --trace B.json`), and report "
            "per stream: kernels, distinct kernels, busy time, gaps between kernels, top "
            "kernels. Several traces are compared side by side (Case-A, Case-B, ...)."
        ),
    )
    tr.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="FILE",
        help="an existing Chrome trace (repeat to compare)",
    )
    tr.add_argument("--json", action="store_true", help="print JSON instead of tables")
    tr.add_argument("--top", type=int, default=10, help="kernels to list (default 10)")
    tr.add_argument(
        "--out", metavar="FILE", help="where to keep the trace of CMD (default: a temp file)"
    )
    tr.add_argument(
        "--duration", type=float, default=10.0, help="seconds of CMD to profile (default 10)"
    )
    tr.add_argument(
        "--warmup", type=float, default=0.0, help="seconds of CMD to skip before profiling"
    )
    tr.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD",
        help="a Python script and its arguments (`python` in front is optional; `-m mod` works)",
    )
    tr.set_defaults(func=run_trace, prog=tr.prog)
    parser.set_defaults(func=lambda args: _missing(parser))


def _missing(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


# ----------------------------------------------------------------------------------------------
# amd-log


def run_amd_log(args: argparse.Namespace) -> int:
    from ..monitor import amd_log, amd_log_compare

    paths = [Path(p) for p in args.files]
    for p in paths:
        if not p.exists():
            raise UsageError(f"log file {p} does not exist")
        if p.is_dir():
            raise UsageError(f"{p} is a directory; give log files")
    total = sum(p.stat().st_size for p in paths)
    show_bar = not args.no_progress and sys.stderr.isatty()
    summaries = []
    from tqdm import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, disable=not show_bar, file=sys.stderr) as bar:
        for p in paths:
            bar.set_description(p.name[:30])
            summaries.append(amd_log.analyze_file(p, progress=bar.update))
    comparison = amd_log_compare.compare(summaries, top=args.top) if len(summaries) > 1 else None
    if args.json:
        doc = {
            "files": [s.to_dict(top=args.top) for s in summaries],
            "comparison": comparison,
        }
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    _print_amd(summaries, comparison, args.top)
    return 0


def _print_amd(summaries: list[Any], comparison: dict[str, Any] | None, top: int) -> None:
    from rich.table import Table

    from ..monitor.textfmt import console, num, plain, short

    con = console()
    for s in summaries:
        con.rule(f"[bold]{plain(s.path)}")
        con.print(
            f"{num(s.bytes_read)} bytes, {num(s.lines)} lines ({num(s.log_lines)} runtime, "
            f"{num(s.other_lines)} other, {num(s.unparsed_lines)} unparsed); "
            f"highest log level seen {num(s.max_level)}; span {num(s.span_s, 3)} s; "
            f"{num(s.dispatches)} dispatches ({num(s.dispatch_rate)}/s)"
        )
        if s.processes:
            t = Table(title="processes", title_justify="left")
            for col in ("pid", "lines", "threads", "dispatches", "dispatches/s"):
                t.add_column(col, justify="right")
            for p in sorted(s.processes.values(), key=lambda p: p.pid):
                t.add_row(
                    str(p.pid),
                    num(p.lines),
                    num(p.threads),
                    num(p.dispatches),
                    num(p.dispatch_rate()),
                )
            con.print(t)
        if s.queues:
            t = Table(
                title="hardware queues (HWq = ring buffer address in that process)",
                title_justify="left",
            )
            for col in (
                "pid",
                "HWq",
                "SWq",
                "id",
                "prio",
                "size",
                "dispatches",
                "barrier pkts",
                "acquires",
                "top kernel",
            ):
                t.add_column(
                    col, justify="left" if col in ("HWq", "SWq", "top kernel") else "right"
                )
            for q in s.sorted_queues():
                top_kernel = q.kernels.most_common(1)
                t.add_row(
                    str(q.pid) if q.pid is not None else "-",
                    q.hw_queue,
                    q.sw_queue or "-",
                    num(q.id),
                    num(q.priority),
                    num(q.size),
                    num(q.dispatches),
                    num(q.barrier_packets),
                    num(q.acquires),
                    short(top_kernel[0][0], 50) if top_kernel else "-",
                )
            con.print(t)
        kernels = s.sorted_kernels()
        if kernels:
            t = Table(
                title=f"kernels (top {min(top, len(kernels))} of {len(kernels)})",
                title_justify="left",
            )
            for col in ("launches", "dispatches", "grid", "workgroup", "name"):
                t.add_column(col, justify="left" if col == "name" else "right")
            for k in kernels[:top]:
                grid = k.grids.most_common(1)
                wg = k.workgroups.most_common(1)
                t.add_row(
                    num(k.count),
                    num(k.dispatches),
                    _shape(grid[0][0]) if grid else "-",
                    _shape(wg[0][0]) if wg else "-",
                    short(k.name, 80),
                )
            con.print(t)
        if s.dispatches or s.barrier_packets:
            con.print(
                f"packets: {num(s.dispatches)} kernel dispatches, {num(s.barrier_bit)} with the "
                f"barrier bit; acquire fences {dict(s.acquire_scopes)}; release fences "
                f"{dict(s.release_scopes)}; {num(s.barrier_packets)} barrier packets "
                f"{dict(s.barrier_kinds) if s.barrier_kinds else ''}"
            )
        for note in s.notes():
            con.print(f"[yellow]note:[/] {plain(note)}")
        for ex in s.unparsed_examples[:3]:
            con.print(f"  unparsed: {plain(repr(ex))}")
    if comparison is None:
        return
    con.rule("[bold]comparison")
    labels = comparison["labels"]
    t = Table()
    t.add_column("")
    for label, path in zip(labels, comparison["paths"], strict=True):
        t.add_column(f"{label}\n{plain(Path(path).name)}", justify="right")
    for row in comparison["rows"]:
        t.add_row(row["metric"], *(num(v, 2) for v in row["values"]))
    con.print(t)
    shared = comparison["shared_queues"]
    shared_text = ", ".join(f"{q['pid']}:{q['hw_queue']}" for q in shared) or "none"
    con.print(f"shared queues (same pid and HWq in every file): {shared_text}")
    if comparison["same_address_other_process"]:
        con.print(
            "same HWq address in different processes (separate queues, not shared): "
            + ", ".join(comparison["same_address_other_process"])
        )
    con.print(f"kernels present in every file: {comparison['shared_kernels']}")
    t = Table(title="top kernels", title_justify="left")
    for label in labels:
        t.add_column(label)
    tops = comparison["top_kernels"]
    for i in range(max((len(k) for k in tops), default=0)):
        t.add_row(
            *(
                f"{num(k[i]['count'])}  {short(k[i]['name'], 60)}" if i < len(k) else ""
                for k in tops
            )
        )
    con.print(t)
    for label, names in comparison["kernels_only_in"].items():
        if names:
            con.print(f"only in {label}: " + "; ".join(short(n, 60) for n in names[:5]))


def _shape(shape: Any) -> str:
    return "x".join(str(v) for v in shape) if isinstance(shape, tuple) else str(shape)


# ----------------------------------------------------------------------------------------------
# trace


def run_trace(args: argparse.Namespace) -> int:
    from ..monitor import trace

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    paths: list[str] = []
    if command:
        paths.append(_profile_command(command, args))
    paths.extend(args.trace)
    if not paths:
        raise UsageError(
            "nothing to analyse: give `-- script.py ARGS` to profile a workload, or "
            "`--trace FILE` for a saved Chrome trace"
        )
    summaries = [trace.summarize(p) for p in paths]
    comparison = trace.compare(summaries, top=args.top) if len(summaries) > 1 else None
    if args.json:
        json.dump(
            {"traces": [s.to_dict(args.top) for s in summaries], "comparison": comparison},
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    _print_trace(summaries, comparison, args.top)
    return 0


_PYTHONS = ("python", "python3")


def trace_wrapper_argv(command: list[str], out: str, duration: float, warmup: float) -> list[str]:
    """The command line that runs ``command`` (a Python script) under the profiler wrapper."""
    script = list(command)
    if script and (Path(script[0]).name in _PYTHONS or Path(script[0]).name.startswith("python3")):
        script = script[1:]
    if not script:
        raise UsageError("no script given after `--`")
    if script[0] != "-m" and not script[0].endswith(".py") and not Path(script[0]).is_file():
        raise UsageError(
            f"{script[0]!r} is not a Python script; `analyze trace` runs Python workloads "
            "(`-- script.py ARGS` or `-- -m package.module ARGS`)"
        )
    return [
        sys.executable,
        "-m",
        "gpreempt.monitor.trace_wrapper",
        out,
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--",
        *script,
    ]


def _profile_command(command: list[str], args: argparse.Namespace) -> str:
    argv = trace_wrapper_argv(command, args.out or "", args.duration, args.warmup)
    script = argv[argv.index("--") + 1]
    if script != "-m" and not Path(script).is_file():
        raise UsageError(f"no such script: {script!r}")
    scratch = None if args.out else tempfile.mkdtemp(prefix="gpreempt-trace-")
    out = args.out or os.path.join(scratch, "trace.json")
    argv[3] = out  # [python, -m, trace_wrapper, OUT, ...]
    print(f"profiling: {' '.join(command)}  (up to {args.duration:g} s)", file=sys.stderr)
    rc = subprocess.call(argv)
    if rc != 0 or not os.path.exists(out):
        if scratch is not None:  # a trace of a failed run is not worth its space in /tmp
            shutil.rmtree(scratch, ignore_errors=True)
        if rc != 0:
            raise GpreemptError(
                f"the profiled command failed (exit code {rc}, its error is above); "
                "nothing to analyse"
            )
        raise GpreemptError(
            "the profiled command wrote no trace; is torch installed and does the script "
            "run on its own?"
        )
    print(f"trace: {out}", file=sys.stderr)
    return out


def _print_trace(summaries: list[Any], comparison: dict[str, Any] | None, top: int) -> None:
    from rich.table import Table

    from ..monitor.textfmt import console, num, plain, short

    con = console()
    for s in summaries:
        con.rule(f"[bold]{plain(s.path)}")
        con.print(
            f"{num(s.gpu_events)} GPU events of {num(s.events)}; {num(s.kernels)} kernels "
            f"({len(s.by_name)} distinct) on {len(s.streams)} stream(s); span "
            f"{num(s.span_us / 1e3, 2)} ms"
        )
        if not s.gpu_events:
            con.print(
                "[yellow]note:[/] no GPU kernels in this trace (no GPU visible to the profiler, "
                "or no GPU work in the profiled window: try a longer --duration)"
            )
            continue
        t = Table(title="streams", title_justify="left")
        for col in (
            "device",
            "stream",
            "kernels",
            "distinct",
            "copies",
            "busy ms",
            "span ms",
            "busy %",
            "gaps",
            "gap p50 us",
            "gap p99 us",
            "gap max us",
            "top kernel",
        ):
            t.add_column(col, justify="left" if col == "top kernel" else "right")
        for st in s.streams:
            g = st.gap_stats()
            tk = st.top_kernels(1)
            t.add_row(
                num(st.device),
                num(st.stream),
                num(st.kernels),
                num(st.distinct_kernels),
                num(st.memcpys + st.memsets),
                num(st.busy_us / 1e3, 2),
                num(st.span_us / 1e3, 2),
                num(100 * st.busy_fraction if st.busy_fraction is not None else None),
                num(g["count"]),
                num(g["p50_us"]),
                num(g["p99_us"]),
                num(g["max_us"]),
                short(tk[0]["name"], 40) if tk else "-",
            )
        con.print(t)
        t = Table(title=f"top kernels by GPU time (of {len(s.by_name)})", title_justify="left")
        for col in ("count", "total ms", "mean us", "name"):
            t.add_column(col, justify="left" if col == "name" else "right")
        for k in s.top_kernels(top):
            t.add_row(
                num(k["count"]),
                num(k["total_us"] / 1e3, 2),
                num(k["mean_us"]),
                short(k["name"], 90),
            )
        con.print(t)
    if comparison is None:
        return
    con.rule("[bold]comparison")
    t = Table()
    t.add_column("")
    for label, path in zip(comparison["labels"], comparison["paths"], strict=True):
        t.add_column(f"{label}\n{plain(Path(path).name)}", justify="right")
    for row in comparison["rows"]:
        t.add_row(row["metric"], *(num(v, 2) for v in row["values"]))
    con.print(t)
