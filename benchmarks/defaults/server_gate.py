"""What its own launch gate costs an eager server (ResNet-50 b8, no CUDA graph), on GPU 0.

A task that preempts others (``--priority high``) gets an unbounded gate whose operator hook
notices its launches (automatic activity). An eager server runs hundreds of operators per
request, each through that hook; once the process calls ``request()`` its requests say when
it is active, and the gate may sleep (hook off) while the daemon allows it.

Interleaved rounds in one process, requests one at a time with exponential gaps (mean 13 ms,
about load 0.5), each request's own time (no queue):

- ``none``: no gate;
- ``awake``: the gate ``gpreempt run --priority high`` gives (unbounded, automatic activity,
  no grace);
- ``asleep``: the same gate after the process used ``request()`` and the daemon allowed it
  to sleep (``sleep_ok``).

Usage: PYTHONPATH=src python3 benchmarks/defaults/server_gate.py --out DIR [--rounds 6]
[--requests 150]. Writes DIR/server_gate.json; prints a table.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from gpreempt.bench import stats
from gpreempt.bench.builtin_workloads import resnet50_server
from gpreempt.client.agent import gate_config_for
from gpreempt.client.gate import install_gate
from gpreempt.control_block import ControlBlock
from gpreempt.priority import NAMED

CONFIGS = ("none", "awake", "asleep")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=150, help="per configuration and round")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    handle = resnet50_server(8, graph=False)
    for _ in range(50):
        handle()
    rng = random.Random(1)
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    asleep_seen: dict[str, int] = {name: 0 for name in CONFIGS}
    for _ in range(args.rounds):
        for name in CONFIGS:
            control = ControlBlock.create()
            gate = None
            if name != "none":
                gate = install_gate(control, gate_config_for(NAMED["high"], "auto"))
            if name == "asleep":
                control.set_requests(1)  # the process used request()
                control.set_requests(0)
                control.set_sleep_ok(True)  # the daemon's word
                deadline = time.monotonic() + 1.0
                while not gate.stats()["asleep"] and time.monotonic() < deadline:
                    time.sleep(0.001)
            for _ in range(args.requests):
                time.sleep(rng.expovariate(1 / 0.013))
                start = time.perf_counter()
                handle()
                times[name].append((time.perf_counter() - start) * 1e3)
            if gate is not None:
                asleep_seen[name] += int(gate.stats()["asleep"])
                gate.uninstall()
            control.close()
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "rounds": args.rounds,
        "requests_per_round": args.requests,
        "service_ms": {name: stats.latency_summary(values) for name, values in times.items()},
        "rounds_ending_asleep": asleep_seen,
    }
    (args.out / "server_gate.json").write_text(json.dumps(result, indent=1))
    base = result["service_ms"]["none"]
    print(f"{'gate':8s} {'mean ms':>8s} {'p50 ms':>7s} {'p99 ms':>7s}  mean/none  p50/none")
    for name, row in result["service_ms"].items():
        print(
            f"{name:8s} {row['mean']:8.2f} {row['p50']:7.2f} {row['p99']:7.2f}"
            f"  {row['mean'] / base['mean']:9.3f}  {row['p50'] / base['p50']:8.3f}"
        )
    print(f"rounds ending asleep: {asleep_seen}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
