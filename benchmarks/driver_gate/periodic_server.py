"""A server of fixed period for ``transitions.sh``: a CUDA graph of matrix products that takes
about ``--busy-ms`` alone, then nothing until ``--busy-ms + --idle-ms`` have passed since the
request was due, each request marked with ``gpreempt.request()`` (unless ``--no-request``).

A fixed period makes every request a suspension of the trainer beside it, so what each
suspension costs both sides shows without Poisson arrivals' queueing. Writes (and prints) one
JSON object: its loop's span in unix time, the requests' count and service times (ms).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch

import gpreempt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy-ms", type=float, default=1.3)
    p.add_argument("--idle-ms", type=float, default=1.3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--no-request", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.half)
    y = torch.empty_like(x)
    s = torch.cuda.Stream()

    def graph_of(k: int) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            for _ in range(3):
                for _ in range(k):
                    torch.mm(x, x, out=y)
            s.synchronize()
            with torch.cuda.graph(g, stream=s):
                for _ in range(k):
                    torch.mm(x, x, out=y)
        return g

    g1 = graph_of(8)
    g1.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        g1.replay()
    torch.cuda.synchronize()
    per = (time.perf_counter() - t) / 20 / 8 * 1e3
    k = max(1, round(a.busy_ms / per))
    g = graph_of(k)
    mark = contextlib.nullcontext if a.no_request else gpreempt.request
    for _ in range(30):
        g.replay()
        torch.cuda.current_stream().synchronize()
    period = (a.busy_ms + a.idle_ms) / 1e3
    svc: list[float] = []
    lat: list[float] = []
    start = time.time()
    nxt = time.perf_counter()
    while time.time() - start < a.seconds:
        t0 = time.perf_counter()
        with mark():
            g.replay()
            torch.cuda.current_stream().synchronize()
        t1 = time.perf_counter()
        svc.append((t1 - t0) * 1e3)
        lat.append((t1 - nxt) * 1e3)
        nxt += period
        time.sleep(max(0.0, nxt - time.perf_counter()))
    end = time.time()
    svc.sort()
    lat.sort()

    def q(v: list[float], f: float) -> float:
        return v[min(len(v) - 1, int(f * len(v)))]

    r = {
        "start": start,
        "end": end,
        "n": len(svc),
        "k": k,
        "svc_mean": statistics.mean(svc),
        "svc_p50": q(svc, 0.5),
        "svc_p99": q(svc, 0.99),
        "lat_p99": q(lat, 0.99),
    }
    with open(a.out, "w") as f:
        json.dump(r, f)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
