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
                "scenario": {
                    "a-alone": "Case-A alone",
                    "time-sliced": "co-located, no gpreempt",
                    "gpreempt": "co-located, gpreempt",
                }.get(r["scenario"], r["scenario"]),
                "p50": r["a_p50_ms"],
                "p99": r["a_p99_ms"],
                "b": r["b_steps_per_s"],
                "note": "" if r.get("valid", True) else f"invalid: {r.get('invalid_reason')}",
            }
            for r in result["rows"]
        ]
        show(console, rows, "Case-B steps/s")
        console.print(f"full results: {result['out_dir']}")
        return 0

    from ..bench.cpu_demo import run_demo

    console.print(
        "[bold]No GPU here:[/bold] running the same scenario on the CPU, with the signal "
        "mechanism. One CPU core stands in for the shared GPU."
    )
    result = run_demo(
        requests=args.requests, progress=lambda name: console.print(f"  running: {name}")
    )
    names = {
        "alone": "Case-A alone",
        "co-located": "co-located, no gpreempt",
        "gpreempt": "co-located, gpreempt",
    }
    rows = [
        {
            "scenario": names[r["scenario"]],
            "p50": r["a_latency_ms"]["p50"],
            "p99": r["a_latency_ms"]["p99"],
            "b": r["b_steps_per_s"],
            "note": "",
        }
        for r in result["rows"]
    ]
    show(console, rows, "Case-B steps/s")
    console.print(
        f"Case-A request = {result['service_ms']:.1f} ms of CPU work, "
        f"{result['rate_per_s']:.0f} requests/s (load 0.5)."
    )
    return 0


def show(console: Any, rows: list[dict[str, Any]], b_title: str) -> None:
    from rich.table import Table

    def fmt(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    table = Table(title="Case-A latency (ms) and Case-B progress")
    table.add_column("scenario")
    table.add_column("Case-A P50", justify="right")
    table.add_column("Case-A P99", justify="right")
    table.add_column(b_title, justify="right")
    notes = any(row["note"] for row in rows)
    if notes:
        table.add_column("note")
    for row in rows:
        cells = [row["scenario"], fmt(row["p50"]), fmt(row["p99"]), fmt(row["b"], 1)]
        table.add_row(*cells, *([row["note"]] if notes else []))
    console.print(table)
