"""The tables ``gpreempt analyze`` prints (rich): one section per log or trace, then their
comparison. The numbers come from :mod:`gpreempt.monitor.amd_log` and
:mod:`gpreempt.monitor.trace`; this module only lays them out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def print_amd_log_tables(summaries: list[Any], comparison: dict[str, Any] | None, top: int) -> None:
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


def print_trace_tables(summaries: list[Any], comparison: dict[str, Any] | None, top: int) -> None:
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
