"""The eager ResNet-50 b8 server's service time, process by process: how far it moves.

An eager server is CPU-bound (it launches some 280 kernels a request, which keep its GPU busy
about 1.1 ms of it: eager_gaps.py), and its service time moves from one process to the next.
Eight processes one after the other, two left free, two pinned to the GPU's NUMA node (every
CPU, on a machine of one node), four pinned to one CPU each: each warms up, serves 100 requests
one at a time, then 300 open loop (Poisson) at 0.5 of the first 100's mean, and prints the
means. No gpreempt. A bench run's load, fixed from its calibration, moves with it
(``gpreempt bench`` checks it alone first: docs/bench.md#load).

    PYTHONPATH=src python3 benchmarks/defaults/eager_service.py --out eager_service.json

Each process's record: where it ran, ``bench`` (cudnn.benchmark, as the server sets it), and
its service times (ms): one at a time (``iso_*``) and at load (``load_*``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time


def child() -> None:
    """One process's figures, as a JSON line."""
    import torch

    from gpreempt.bench.builtin_workloads import resnet50_server

    serve = resnet50_server(batch=8, graph=False)
    for _ in range(50):
        serve()
    alone = []
    for _ in range(100):
        start = time.perf_counter()
        serve()
        alone.append((time.perf_counter() - start) * 1e3)
        time.sleep(0.002)
    rate = 0.5 / (statistics.fmean(alone) / 1e3)
    rng, due, at_load = random.Random(1), time.perf_counter() + 0.01, []
    for _ in range(300):
        due += rng.expovariate(rate)
        while time.perf_counter() < due:
            pass
        start = time.perf_counter()
        serve()
        at_load.append((time.perf_counter() - start) * 1e3)
    q = sorted(at_load)
    print(
        json.dumps(
            {
                "bench": torch.backends.cudnn.benchmark,
                "iso_mean": statistics.fmean(alone),
                "iso_p50": statistics.median(alone),
                "load_mean": statistics.fmean(at_load),
                "load_p50": q[150],
                "load_p90": q[270],
                "load_max": q[-1],
            }
        )
    )


def placements() -> list[tuple[str, str | None]]:
    """(name, CPU list for taskset, None: free) of each process."""
    base = "/sys/devices/system/node"
    nodes = (
        sorted(n for n in os.listdir(base) if n.startswith("node")) if os.path.isdir(base) else []
    )
    where: list[tuple[str, str | None]] = [("free", None)] * 2
    for node in nodes:
        with open(f"{base}/{node}/cpulist") as f:
            where += [(node, f.read().strip())] * 2
    n = os.cpu_count() or 1
    return where + [(f"cpu{c}", str(c)) for c in (1, n // 4 + 1, n // 2 + 1, 3 * n // 4 + 1)]


def main() -> None:
    """One line a process: its placement, then ms one at a time (iso) and at load 0.5; with
    ``--out FILE``, every record as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write every process's record here as JSON")
    out = parser.parse_args().out
    records = []
    for name, cpus in placements():
        pin = ["taskset", "-c", cpus] if cpus else []
        done = subprocess.run(
            [*pin, sys.executable, __file__, "child"], capture_output=True, text=True
        )
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if not lines:
            print(f"{name}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = {**json.loads(lines[-1]), "where": name}
        records.append(r)
        print(
            f"{name:8} iso mean {r['iso_mean']:.2f} p50 {r['iso_p50']:.2f} | at load: mean "
            f"{r['load_mean']:.2f} p50 {r['load_p50']:.2f} p90 {r['load_p90']:.2f} "
            f"max {r['load_max']:.1f}",
            flush=True,
        )
    if out:
        with open(out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    child() if sys.argv[1:] == ["child"] else main()
