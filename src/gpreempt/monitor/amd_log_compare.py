"""Two or more HIP/CLR runtime logs side by side (Case-A vs Case-B): counts, top kernels,
and what they share."""

from __future__ import annotations

from typing import Any

from .amd_log_summary import LogSummary


def compare(summaries: list[LogSummary], top: int = 10) -> dict[str, Any]:
    """Side-by-side facts of two or more logs: counts, top kernels, what they share.

    Queue addresses belong to a process's address space, so two logs share a queue only when
    the same process (pid) used the same HWq in both; equal addresses in different processes
    are reported separately, as a coincidence of allocation and not a shared queue.
    """
    labels = [_label(i) for i in range(len(summaries))]
    rows = []

    def row(metric: str, values: list[Any]) -> None:
        rows.append({"metric": metric, "values": values})

    row("processes", [len(s.processes) for s in summaries])
    row("hardware queues", [len(s.queues) for s in summaries])
    row("queues created in log", [sum(q.created for q in s.queues.values()) for s in summaries])
    row(
        "queue priorities",
        [
            sorted({q.priority for q in s.queues.values() if q.priority is not None})
            for s in summaries
        ],
    )
    row("dispatches", [s.dispatches for s in summaries])
    row("kernel launches (ShaderName)", [s.shader_lines for s in summaries])
    row("distinct kernels", [len(s.kernels) for s in summaries])
    row("barrier packets", [s.barrier_packets for s in summaries])
    row("dispatches with barrier bit", [s.barrier_bit for s in summaries])
    row("span (s)", [s.span_s for s in summaries])
    row("dispatch rate (/s)", [s.dispatch_rate for s in summaries])
    row("unparsed lines", [s.unparsed_lines for s in summaries])

    keysets = [set(s.queues) for s in summaries]
    shared = set.intersection(*keysets) if keysets else set()
    shared_queues = [
        {"pid": pid, "hw_queue": hw} for pid, hw in sorted(shared, key=lambda k: (k[0] or 0, k[1]))
    ]
    addr_sets = [{hw for _pid, hw in ks} for ks in keysets]
    same_addr = set.intersection(*addr_sets) - {hw for _pid, hw in shared} if addr_sets else set()

    names = [set(s.kernels) for s in summaries]
    common = set.intersection(*names) if names else set()
    top_kernels = [
        [{"name": k.name, "count": max(k.count, k.dispatches)} for k in s.sorted_kernels()[:top]]
        for s in summaries
    ]
    only = {
        labels[i]: sorted(
            names[i] - set.union(*(n for j, n in enumerate(names) if j != i)),
            key=lambda n, s=summaries[i]: -max(s.kernels[n].count, s.kernels[n].dispatches),
        )[:top]
        for i in range(len(summaries))
    }
    return {
        "labels": labels,
        "paths": [s.path for s in summaries],
        "rows": rows,
        "shared_queues": shared_queues,
        "same_address_other_process": sorted(same_addr),
        "shared_kernels": len(common),
        "shared_kernel_names": sorted(common)[:top],
        "top_kernels": top_kernels,
        "kernels_only_in": only,
    }


def _label(index: int) -> str:
    return f"Case-{chr(ord('A') + index)}" if index < 26 else f"Case-{index + 1}"
