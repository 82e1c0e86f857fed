"""``gpreempt demo``: the online/offline scenario in under two minutes."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="show online inference preempting offline training (a short run)",
        description=(
            "Case-A (online inference, high priority, Poisson requests at load 0.5) beside "
            "Case-B (offline training, low priority): Case-A alone, co-located without "
            "gpreempt, and under gpreempt. On a GPU: ResNet-50 inference beside Transformer "
            "training. Without a GPU: CPU stand-ins sharing one core, with the signal mechanism."
        ),
    )
    parser.add_argument("--cpu", action="store_true", help="run the CPU version even on a GPU")
    parser.add_argument(
        "--requests", type=int, default=200, help="Case-A requests per scenario on the CPU"
    )
    parser.set_defaults(func=run)


def gpu_available() -> bool:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a torch without NumPy says so on import
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())


#: How the table names each scenario of the CPU and the GPU demo.
NAMES = {
    "a-alone": "Case-A alone",
    "b-alone": "Case-B alone",
    "co-located": "both, no gpreempt",
    "time-sliced": "both, no gpreempt",
    "gpreempt": "both, gpreempt",
}


#: Case-A alone slower at the median than this many times its work: the machine was busy
#: (at load 0.5 a request waits for half a request's work on average).
BUSY_FACTOR = 2.0


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if args.requests < 20:
        raise UsageError("--requests must be at least 20 for a meaningful P99")
    if not args.cpu and gpu_available():
        from ..bench.gpu_demo import run_gpu_demo

        console.print("GPU found: Case-A ResNet-50 inference beside Case-B Transformer training.")
        result = run_gpu_demo(quick=True)
        rows = [
            {
                "scenario": NAMES.get(r["scenario"], r["scenario"]),
                "p50": r["a_p50_ms"],
                "p99": r["a_p99_ms"],
                "p99_ratio": r.get("a_p99_ratio"),
                "b": r["b_steps_per_s"],
                "b_kept": r.get("b_kept"),
                "note": "" if r.get("valid", True) else f"invalid: {r.get('invalid_reason')}",
            }
            for r in result["rows"]
        ]
        show(console, rows)
        console.print(f"full results: {result['out_dir']}")
        return 0

    from ..bench.cpu_demo import run_demo

    console.print(
        "[bold]No GPU here:[/bold] the same scenario on the CPU. One CPU core stands in for "
        "the shared GPU; gpreempt suspends Case-B with signals."
    )
    result = run_demo(
        requests=args.requests, progress=lambda name: console.print(f"  running: {name}")
    )
    rows = [
        {
            "scenario": NAMES[r["scenario"]],
            "p50": (r["a_latency_ms"] or {}).get("p50"),
            "p99": (r["a_latency_ms"] or {}).get("p99"),
            "p99_ratio": r["a_p99_ratio"],
            "b": r["b_steps_per_s"],
            "b_kept": r["b_kept"],
            "note": "",
        }
        for r in result["rows"]
    ]
    show(console, rows)
    note = busy_note(rows, result["service_ms"])
    if note:
        console.print(note)
    console.print(
        f"A Case-A request was {result['service_ms']:.1f} ms of CPU work here, "
        f"{result['rate_per_s']:.0f} requests/s (load 0.5). A CPU stand-in's milliseconds "
        "move with this machine's load from run to run: read the ratios, each to the alone "
        "run of this run."
    )
    return 0


def show(console: Any, rows: list[dict[str, Any]]) -> None:
    """The demo's table, then one line on what gpreempt bought and what it cost."""
    from rich.table import Table

    def fmt(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    table = Table(title="Case-A latency (ms) and Case-B speed (training steps/s)")
    table.add_column("scenario")
    for header in ("A P50", "A P99", "P99/alone", "B steps/s", "B/alone"):
        table.add_column(header, justify="right")
    notes = any(row["note"] for row in rows)
    if notes:
        table.add_column("note")
    for row in rows:
        cells = [
            row["scenario"],
            fmt(row["p50"]),
            fmt(row["p99"]),
            fmt(row["p99_ratio"]),
            fmt(row["b"], 1),
            fmt(row["b_kept"]),
        ]
        table.add_row(*cells, *([row["note"]] if notes else []))
    console.print(table)
    line = verdict(rows)
    if line:
        console.print(line)


def verdict(rows: list[dict[str, Any]]) -> str | None:
    """What gpreempt bought (Case-A's P99 against alone, with and without it) and what it
    cost (Case-B's speed kept, with and without it), in one sentence."""
    by_name = {row["scenario"]: row for row in rows}
    without, under = by_name.get(NAMES["co-located"]), by_name.get(NAMES["gpreempt"])
    if not without or not under:
        return None
    keys = ("p99_ratio", "b_kept")
    if any(row[k] is None for row in (without, under) for k in keys):
        return None
    return (
        f"Under gpreempt Case-A's P99 was {under['p99_ratio']:.2f}x its P99 alone "
        f"({without['p99_ratio']:.2f}x without gpreempt), and Case-B kept "
        f"{under['b_kept']:.2f} of its speed alone ({without['b_kept']:.2f} without)."
    )


def busy_note(rows: list[dict[str, Any]], service_ms: float) -> str | None:
    """A warning when Case-A alone was much slower than its work: something else ran on the
    stand-in's core, and the table measures that as much as gpreempt."""
    alone = next((r for r in rows if r["scenario"] == NAMES["a-alone"]), None)
    if alone is None or alone["p50"] is None or alone["p50"] <= BUSY_FACTOR * service_ms:
        return None
    return (
        f"[yellow]This machine was busy:[/] Case-A alone took {alone['p50']:.1f} ms at the "
        f"median for {service_ms:.1f} ms of work, so other load shaped these numbers; run "
        "the demo again on an idle machine."
    )
