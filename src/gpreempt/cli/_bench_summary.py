"""What ``gpreempt bench`` prints when a run ends: one table per trainer, and the lines that
must not be missed (suspensions that did not hold, memory that ran out)."""

from __future__ import annotations

from pathlib import Path


def print_summary(results: dict, out_dir: Path, case_b: str = "") -> None:
    """The run's table on the terminal (``case_b``: the trainer it is of, in a shared run),
    and a line for each scenario whose suspensions did not hold or whose memory ran out."""
    from rich.console import Console
    from rich.table import Table

    from ..bench.load import describe_load_check

    beside = f", beside {case_b}" if case_b else ""
    table = Table(
        title=f"gpreempt bench{beside} (Case-A P99 ratio: lower is better, 1.0 = as alone)"
    )
    columns = ("scenario", "valid", "A P99 ms", "P99 ratio", "B kept", "B late", "A busy", "system")
    for column in columns:
        table.add_column(column, justify="left" if column == "scenario" else "right")

    def fmt(value: object, digits: int = 2) -> str:
        return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "n/a"

    for name, row in results["scenarios"].items():
        latency = row.get("a_latency_ms") or {}
        table.add_row(
            name,
            "yes" if row.get("valid") else "NO",
            fmt(latency.get("p99"), 3),
            fmt(row.get("a_p99_ratio")),
            fmt(row.get("b_kept")),
            fmt(row.get("b_late_steps"), 0),
            fmt(row.get("a_busy")),
            fmt(row.get("system_throughput")),
        )
    console = Console()
    console.print(table)
    console.print(
        "B late: Case-B's steps that completed more than 1.5 of its steps into a period in "
        "which the daemon counted Case-A active (its work went on beside Case-A's)"
    )
    for name, row in results["scenarios"].items():
        if row.get("hold_leaks"):
            console.print(
                f"[bold red]not held[/]: {name}: the daemon found {row['hold_leaks']} "
                "suspension(s) that did not hold (report.md)"
            )
    for name, row in results["scenarios"].items():
        if "a_oom" not in row:
            continue
        oom = row.get("a_oom")
        got = "n/a" if oom is None else ("no (out of memory)" if oom else "yes")
        evict = (row.get("memory_events") or {}).get("evict") or {}
        console.print(
            f"{name}: Case-A got its memory: {got}; growth request "
            f"{fmt(row.get('a_growth_request_ms'), 1)} ms; evictions {evict.get('count', 'n/a')}; "
            f"Case-B survived: {'yes' if row.get('b_survived') else 'no'}"
        )
    params = results.get("params", {})
    checked = describe_load_check(params.get("load_check"), params.get("arrival_rate_per_s"))
    if checked:
        console.print(checked)
    console.print(f"results: {out_dir / 'results.json'}, report: {out_dir / 'report.md'}")
