"""How much of an eager ResNet-50 b8 request's time its GPU works, and in what gaps it idles.

Alone, no gpreempt (``torch.profiler`` needs CUPTI). Per request (a ``record_function`` range):
its wall time, the time its kernels and copies keep the GPU busy (their union), the time before
the first and after the last, and the idle gaps between them. The profiler slows the CPU side
(wall times read two to three times those without it); the GPU's busy time and the gaps' sizes are
what it is for: a trainer could use the GPU inside such requests only in gaps of tens of us.

    PYTHONPATH=src python3 benchmarks/defaults/eager_gaps.py --requests 60 > eager_gaps.txt
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=60)
    a = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpreempt.bench.builtin_workloads import resnet50_server

    serve = resnet50_server(batch=8, graph=False)
    for _ in range(30):
        serve()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(a.requests):
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
    requests = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("name") == "request" and e.get("cat") == "user_annotation"
    )
    rows, all_gaps = [], []
    for request in requests:
        found = busy_and_gaps(request, gpu)
        if found is None:
            continue
        busy, gaps, lead, tail = found
        rows.append((request[1] - request[0], busy, lead, tail, len(gaps), sum(gaps)))
        all_gaps += gaps
    medians = (statistics.median(c) / 1e3 for c in zip(*rows, strict=True))
    wall, busy, lead, tail, count, idle = medians
    print(
        f"requests {len(rows)}: wall {wall:.2f} ms, GPU busy {busy:.2f} ms ({busy / wall:.2f}), "
        f"before first kernel {lead:.2f} ms, after last {tail:.2f} ms, gaps {count * 1e3:.0f} "
        f"summing {idle:.2f} ms"
    )
    q = sorted(all_gaps)
    pick = [q[min(len(q) - 1, int(f * len(q)))] for f in (0.5, 0.9, 0.99)]
    long_share = sum(g for g in q if g >= 50) / sum(q)
    print(
        f"idle gaps inside requests (us): p50 {pick[0]:.1f} p90 {pick[1]:.1f} p99 {pick[2]:.1f} "
        f"max {q[-1]:.1f}; share of idle in gaps >= 50 us {long_share:.2f}"
    )


if __name__ == "__main__":
    main()
