"""What the driver-level gate costs per launch, measured alone (no daemon, no other task).

Each configuration runs in a fresh process (the CUDA driver loads the gate at cuInit), in
rounds whose order is shuffled, and times a loop of tiny launches: PyTorch ``x.add_(1)`` on a
one-element tensor, and a CuPy raw kernel. Configurations:

* ``none``: no gate loaded (``CUDA_INJECTION64_PATH`` unset);
* ``asleep``: the gate loaded, its callbacks off (the daemon let it sleep: nobody more important
  has been active for a while);
* ``awake``: callbacks on, nobody more important registered (no barriers);
* ``awake-barriers``: callbacks on and stream barriers every 100 us of GPU time (a more
  important task is registered; tiny kernels: a barrier every few launches).

    PYTHONPATH=src python3 benchmarks/driver_gate/launch_cost.py --out results.json

Prints a table of the median nanoseconds per launch and writes every round to ``--out``.
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

CONFIGS = ("none", "asleep", "awake", "awake-barriers")

CHILD = r"""
import json, os, sys, time
config, framework, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if config != "none":
    from gpreempt.control_block import ControlBlock
    from gpreempt.client.gate import driver
    block = ControlBlock.create()
    cfg = driver.DriverConfig(bound=True, auto_activity=False)
    assert driver.adopt(block.memfd, block.doorbell, cfg, torch_gate=False)
    if config == "asleep":
        block.set_sleep_ok(True)
    if config == "awake-barriers":
        block.set_window_share(1.0)
if framework == "torch":
    import torch
    x = torch.zeros(1, device="cuda")
    launch = lambda: x.add_(1)
    sync = torch.cuda.synchronize
else:
    import cupy as cp
    k = cp.RawKernel(r'extern "C" __global__ void k(float* p) { p[0] += 1.0f; }', "k")
    y = cp.zeros(1, cp.float32)
    launch = lambda: k((1,), (1,), (y,))
    sync = cp.cuda.Device().synchronize
for _ in range(2000):
    launch()
sync()
time.sleep(0.05)  # the gate's thread sees sleep_ok and switches its callbacks off
if config != "none":
    from gpreempt.client.gate import driver
    assert driver.state() == "on", driver.state()
t0 = time.perf_counter_ns()
for _ in range(n):
    launch()
sync()
t1 = time.perf_counter_ns()
out = {"ns_per_launch": (t1 - t0) / n}
if config != "none":
    s = block.stats()
    out.update(driver_launches=s.driver_launches, barriers=s.driver_barriers,
               asleep=block._get32(68))
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--launches", type=int, default=50000)
    parser.add_argument("--frameworks", default="torch,cupy")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    from gpreempt.client.gate.driver_build import build

    library = str(build())
    rows = []
    for round_ in range(args.rounds):
        order = [(c, f) for c in CONFIGS for f in args.frameworks.split(",")]
        random.shuffle(order)
        for config, framework in order:
            env = dict(os.environ)
            env.pop("CUDA_INJECTION64_PATH", None)
            if config != "none":
                env["CUDA_INJECTION64_PATH"] = env["GPREEMPT_DRIVER_GATE"] = library
            child = [sys.executable, "-X", "faulthandler", "-c", CHILD, config, framework]
            child.append(str(args.launches))
            reply = subprocess.run(child, env=env, capture_output=True, text=True, timeout=300)
            if reply.returncode != 0 or not reply.stdout.strip():
                print(
                    f"{config}/{framework}: exit code {reply.returncode}: {reply.stderr[-3000:]}",
                    file=sys.stderr,
                )
                return 1
            row = json.loads(reply.stdout.strip().splitlines()[-1])
            rows.append({"round": round_, "config": config, "framework": framework, **row})
    table = {}
    for framework in args.frameworks.split(","):
        for config in CONFIGS:
            ns = [
                r["ns_per_launch"]
                for r in rows
                if r["config"] == config and r["framework"] == framework
            ]
            table[f"{framework}/{config}"] = statistics.median(ns)
    if args.out:
        with open(args.out, "w") as f:
            result = {"median_ns_per_launch": table, "rounds": rows, "time": time.time()}
            json.dump(result, f, indent=1)
    print(f"{'framework/config':<24} {'ns/launch':>10} {'vs none':>9}")
    for key, ns in table.items():
        base = table[key.split("/")[0] + "/none"]
        print(f"{key:<24} {ns:>10.0f} {ns - base:>+9.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
