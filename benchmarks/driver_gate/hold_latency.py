"""How fast the driver-level gate stops a process's queued GPU work, measured alone.

A CuPy loop (no PyTorch, no daemon) launches 0.2 ms kernels as fast as it can, each bumping a
counter in host-mapped memory, on a non-blocking stream; the gate has the process's control
block and a more important task is said to be registered (its in-flight share set), so its
stream barriers are on. The main thread closes the gate word at random moments and times how
long the GPU's counter keeps moving (the work already past a barrier), then opens it. With no
barriers the whole queue (up to the gate's 25 ms window) would drain.

    PYTHONPATH=src python3 benchmarks/driver_gate/hold_latency.py --out hold_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import ctypes, json, random, sys, threading, time
from gpreempt.control_block import ControlBlock
from gpreempt.client.gate import driver
closes, barriers = int(sys.argv[1]), sys.argv[2] == "1"
block = ControlBlock.create()
cfg = driver.DriverConfig(bound=True, auto_activity=False, barrier_us=100.0 if barriers else 0.0)
assert driver.adopt(block.memfd, block.doorbell, cfg, torch_gate=False)
block.set_window_share(1.0)
import cupy as cp
host = cp.cuda.runtime.hostAlloc(8, 2)
count = ctypes.c_uint64.from_address(host)
k = cp.RawKernel(r'''extern "C" __global__ void k(unsigned long long* c, long long spin) {
  long long t = clock64(); while (clock64() - t < spin) {}
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(c, 1ULL); }''', "k")
stream = cp.cuda.Stream(non_blocking=True)
stop = False
def loop():
    with stream:
        while not stop:
            k((132,), (128,), (cp.uint64(host), cp.int64(350000)))
threading.Thread(target=loop, daemon=True).start()
time.sleep(1.0)
lat = []
for _ in range(closes):
    time.sleep(random.uniform(0.05, 0.15))
    t0 = time.perf_counter(); last_v = count.value; last_t = t0
    block.set_gate(True)
    while time.perf_counter() - last_t < 0.1:
        v = count.value
        if v != last_v:
            last_v, last_t = v, time.perf_counter()
    lat.append((last_t - t0) * 1e3)
    block.set_gate(False)
stop = True
s = block.stats()
print(json.dumps({"stop_ms": lat, "barriers": s.driver_barriers, "state": driver.state()}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--closes", type=int, default=30)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    from gpreempt.client.gate.driver_build import build

    library = str(build())
    env = {**os.environ, "CUDA_INJECTION64_PATH": library, "GPREEMPT_DRIVER_GATE": library}
    results = {}
    for barriers in ("1", "0"):
        child = [sys.executable, "-X", "faulthandler", "-c", CHILD, str(args.closes), barriers]
        reply = subprocess.run(child, env=env, capture_output=True, text=True, timeout=240)
        if reply.returncode != 0 or not reply.stdout.strip():
            print(
                f"child exited with code {reply.returncode}: {reply.stderr[-3000:]}",
                file=sys.stderr,
            )
            return 1
        results["barriers" if barriers == "1" else "no-barriers"] = json.loads(
            reply.stdout.strip().splitlines()[-1]
        )
    for name, r in results.items():
        ms = sorted(r["stop_ms"])
        p90 = ms[int(0.9 * (len(ms) - 1))]
        print(
            f"{name:<12} stop after close: median {statistics.median(ms):.2f} ms, "
            f"p90 {p90:.2f}, max {ms[-1]:.2f}; barriers put {r['barriers']}; gate {r['state']}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
