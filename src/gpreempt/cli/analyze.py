"""``gpreempt analyze``: the queues and kernels a workload uses, from logs or traces.

* ``gpreempt analyze amd-log FILE [FILE...]``: HIP runtime logs
  (``AMD_LOG_LEVEL=3..5``), plain or gzip, any size; two or more files are
  compared side by side (Case-A vs Case-B).
* ``gpreempt analyze trace -- SCRIPT.py ARGS``: run a PyTorch script under
  torch.profiler and report per CUDA/HIP stream; ``--trace FILE`` (repeatable)
  analyses saved Chrome traces.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import GpreemptError, MechanismUnavailable, UsageError
from ..monitor.trace_wrapper import EXIT_NO_TORCH
from ._analyze_tables import print_amd_log_tables, print_trace_tables


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
            "Run a PyTorch script under torch.profiler (`gpreempt analyze trace -- SCRIPT.py "
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
        "--out", metavar="FILE", help="where to keep the script's trace (default: a temp file)"
    )
    tr.add_argument(
        "--duration", type=float, default=10.0, help="seconds of the script to profile (default 10)"
    )
    tr.add_argument(
        "--warmup", type=float, default=0.0, help="seconds of the script to skip before profiling"
    )
    tr.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- SCRIPT.py ARGS",
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
    print_amd_log_tables(summaries, comparison, args.top)
    return 0


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
            "nothing to analyse: give `-- SCRIPT.py ARGS` to profile a workload, or "
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
    print_trace_tables(summaries, comparison, args.top)
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
            "(`-- SCRIPT.py ARGS` or `-- -m package.module ARGS`)"
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
    if importlib.util.find_spec("torch") is None:
        raise MechanismUnavailable(
            "`analyze trace` profiles with PyTorch's profiler, and PyTorch is not installed "
            f"for {sys.executable}: install it (README, Quick start) or give --trace FILE"
        )
    scratch = None if args.out else tempfile.mkdtemp(prefix="gpreempt-trace-")
    out = args.out or os.path.join(scratch, "trace.json")
    argv[3] = out  # [python, -m, trace_wrapper, OUT, ...]
    print(f"profiling: {' '.join(command)}  (up to {args.duration:g} s)", file=sys.stderr)
    rc = subprocess.call(argv)
    if rc == EXIT_NO_TORCH:
        raise MechanismUnavailable("PyTorch could not be imported: nothing was profiled")
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
