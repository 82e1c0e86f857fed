"""How much of an eager ResNet-50 b8 request's time its GPU works, and in what gaps it idles.

Alone, no gpreempt (``torch.profiler`` needs CUPTI). Per request (a ``record_function`` range):
its wall time, the time its kernels and copies keep the GPU busy (their union), the time before
the first and after the last, and the idle gaps between them. The profiler slows the CPU side
(wall times read two to three times those without it); the GPU's busy time and the gaps' sizes are
what it is for: a trainer could use the GPU inside such requests only in gaps of tens of us.

    PYTHONPATH=src python3 benchmarks/defaults/eager_gaps.py --requests 60 --out eager_gaps.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def busy_and_gaps(
    request: tuple[float, float], gpu: list[tuple[float, float]]
) -> tuple[float, list[float], float, float] | None:
    """(busy us, idle gaps us, us before the first GPU span, after the last) of one request, or
    None where no GPU work fell inside it; ``gpu`` sorted by start."""
    s, t = request
    inside = [(max(x, s), min(y, t)) for x, y in gpu if y > s and x < t]
    if not inside:
        return None
    first, end = inside[0]
    busy, gaps = end - first, []
    for x, y in inside[1:]:
        if x > end:
            gaps.append(x - end)
            busy, end = busy + y - x, y
        elif y > end:
            busy, end = busy + y - end, y
    return busy, gaps, first - s, t - end


def summary(rows: list[dict[str, float]], gaps_us: list[float]) -> dict[str, object]:
    """What the run says, compact: its per-request rows, the gaps' quantiles (us) and the share
    of the idle time that lies in gaps of 50 us or more."""
    q = sorted(gaps_us)
    pick = {f"p{int(f * 100)}": q[min(len(q) - 1, int(f * len(q)))] for f in (0.5, 0.9, 0.99)}
    return {
        "rows": rows,
        "gap_us": {**pick, "max": q[-1], "count": len(q)},
        "idle_share_in_gaps_ge_50us": sum(g for g in q if g >= 50) / sum(q),
    }


def show(found: dict) -> None:
    """The two lines it prints (ms; medians over the requests)."""
    rows = found["rows"]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows) / 1e3

    wall, busy = med("wall_us"), med("busy_us")
    print(
        f"requests {len(rows)}: wall {wall:.2f} ms, GPU busy {busy:.2f} ms ({busy / wall:.2f}), "
        f"before first kernel {med('lead_us'):.2f} ms, after last {med('tail_us'):.2f} ms, gaps "
        f"{med('gaps') * 1e3:.0f} summing {med('gap_us_sum'):.2f} ms"
    )
    g = found["gap_us"]
    print(
        f"idle gaps inside requests (us): p50 {g['p50']:.1f} p90 {g['p90']:.1f} p99 "
        f"{g['p99']:.1f} max {g['max']:.1f}; share of idle in gaps >= 50 us "
        f"{found['idle_share_in_gaps_ge_50us']:.2f}"
    )


def measure(requests: int) -> dict[str, object]:
    """Profile ``requests`` eager requests alone and summarise them."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpreempt.bench.builtin_workloads import resnet50_server

    serve = resnet50_server(batch=8, graph=False)
    for _ in range(30):
        serve()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(requests):
            with record_function("request"):
                serve()
            time.sleep(0.005)
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    spans = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("name") == "request" and e.get("cat") == "user_annotation"
    )
    rows, all_gaps = [], []
    for s, t in spans:
        found = busy_and_gaps((s, t), gpu)
        if found is None:
            continue
        busy, gaps, lead, tail = found
        rows.append(
            {
                "wall_us": t - s,
                "busy_us": busy,
                "lead_us": lead,
                "tail_us": tail,
                "gaps": len(gaps),
                "gap_us_sum": sum(gaps),
            }
        )
        all_gaps += gaps
    return summary(rows, all_gaps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--out", help="write the summary as JSON here")
    p.add_argument(
        "--from",
        dest="raw",
        metavar="FILE",
        help="summarise a raw file of this script's first form ({rows, gaps_us}) instead",
    )
    a = p.parse_args()
    if a.raw:
        with open(a.raw) as f:
            raw = json.load(f)
        found = summary(raw["rows"], raw["gaps_us"])
    else:
        found = measure(a.requests)
    show(found)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
