"""What the driver-level gate costs per launch, measured alone (no daemon, no other task).

Each configuration runs in a fresh process (the CUDA driver loads the gate at cuInit), in
rounds whose order is shuffled, and times a loop of tiny launches: PyTorch ``x.add_(1)`` on a
one-element tensor, a CuPy raw kernel, and (``cuda``) an empty kernel launched from C
(``launch_loop.cu``, built with nvcc), which times the host's launch path alone, in batches
the GPU never falls behind. Configurations:

* ``none``: no gate loaded (``CUDA_INJECTION64_PATH`` unset);
* ``cupti``: no gate; a tools library that turns on the kernel launches' CUPTI callbacks, which
  do nothing (``cupti_probe.cpp``, mode ``launches``): what any gate that sees launches through
  CUPTI costs each;
* ``asleep``: the gate loaded, its callbacks off (the daemon let it sleep: nobody more important
  has been active for a while);
* ``awake``: callbacks on, nobody more important registered (no barriers);
* ``awake-barriers``: callbacks on and stream barriers (a more important task is registered).
  Tiny kernels leave the GPU idle between launches, so the gate learns no GPU time per launch
  and marks every 8 launches (its first spacing, the densest it keeps): a barrier, an event
  behind it, and a timed event before it, as a compiled trainer's launches put one every 6.
* ``CONFIG:NAME=VALUE`` (``--variant CONFIG:NAME=VALUE``, repeatable): a gated configuration
  with that variable set.

    PYTHONPATH=src python3 benchmarks/driver_gate/launch_cost.py --out results.json

Prints a table of the median nanoseconds per launch and, as each round runs every
configuration, the median of the rounds' differences to ``none`` (what drifts between rounds,
a core's clock say, cancels out of those); writes every round to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ("none", "cupti", "asleep", "awake", "awake-barriers")
GATED = CONFIGS[2:]  # the configurations that load the gate (and take a --variant)

CHILD = r"""
import json, os, sys, time
config, framework, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
cores = {int(c) for c in sys.argv[5].split(",") if c} & os.sched_getaffinity(0)
if cores:  # the same cores for every configuration, those of them this machine has
    os.sched_setaffinity(0, cores)
gated = config not in ("none", "cupti")
if gated:
    from gpreempt.control_block import ControlBlock
    from gpreempt.client.gate import driver
    block = ControlBlock.create()
    cfg = driver.DriverConfig(bound=True, auto_activity=False)
    assert driver.adopt(block.memfd, block.doorbell, cfg, torch_gate=False)
    if config == "asleep":
        block.set_sleep_ok(True)
    if config.startswith("awake-barriers"):
        block.set_window_share(1.0)
if framework == "cuda":
    import ctypes
    loop = ctypes.CDLL(sys.argv[4])
    loop.launch_ns.restype = ctypes.c_double
    loop.launch_ns.argtypes = [ctypes.c_int]
    launch = lambda: loop.launch_ns(1)
    sync = lambda: None
elif framework == "torch":
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
if gated:
    from gpreempt.client.gate import driver
    assert driver.state() == "on", driver.state()
if framework == "cuda":
    out = {"ns_per_launch": loop.launch_ns(n)}
    assert out["ns_per_launch"] > 0, "CUDA failed"
else:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        launch()
    sync()
    t1 = time.perf_counter_ns()
    out = {"ns_per_launch": (t1 - t0) / n}
if gated:
    s = block.stats()
    out.update(driver_launches=s.driver_launches, barriers=s.driver_barriers,
               asleep=block._get32(68))
print(json.dumps(out))
"""


def libraries(frameworks: list[str]) -> tuple[str, str, str]:
    """The gate's library, the CUPTI probe's and (for ``cuda``) the launch loop's, built now
    where they are not yet."""
    from gpreempt.client.gate.driver_build import build

    sys.path.insert(0, str(Path(__file__).parent))
    from server_gated import _probe  # cupti_probe.cpp, built with g++

    loop = ""
    if "cuda" in frameworks:
        loop = str(Path(tempfile.mkdtemp(prefix="gpreempt-launch-")) / "launch_loop.so")
        source = Path(__file__).with_name("launch_loop.cu")
        subprocess.run(["nvcc", "-O2", "-shared", "-Xcompiler", "-fPIC", str(source), "-o", loop],
                       check=True)  # fmt: skip
    return str(build()), str(_probe()), loop


def one_run(
    config: str, framework: str, args: argparse.Namespace, built: tuple[str, str, str]
) -> dict:
    """One child's launches under ``config``; RuntimeError with its last words if it failed."""
    library, probe, loop = built
    env = dict(os.environ)
    env.pop("CUDA_INJECTION64_PATH", None)
    if config == "cupti":
        env.update(CUDA_INJECTION64_PATH=probe, GPREEMPT_PROBE="launches")
    elif config.split(":")[0] in GATED:
        env["CUDA_INJECTION64_PATH"] = env["GPREEMPT_DRIVER_GATE"] = library
    name, _, value = config.partition(":")[2].partition("=")
    if name:
        env[name] = value
    child = [sys.executable, "-X", "faulthandler", "-c", CHILD, config, framework]
    child += [str(args.launches), loop, args.cpus]
    reply = subprocess.run(child, env=env, capture_output=True, text=True, timeout=300)
    if reply.returncode != 0 or not reply.stdout.strip():
        raise RuntimeError(
            f"{config}/{framework}: exit code {reply.returncode}: {reply.stderr[-3000:]}"
        )
    return json.loads(reply.stdout.strip().splitlines()[-1])


def summary(rows: list[dict], frameworks: list[str], configs: tuple[str, ...]) -> dict:
    """Per framework and configuration: the median ns per launch over the rounds, and the
    median over the rounds of its difference to ``none`` in the same round."""
    out = {}
    for framework in frameworks:
        mine = [r for r in rows if r["framework"] == framework]
        none = {r["round"]: r["ns_per_launch"] for r in mine if r["config"] == "none"}
        for config in configs:
            ns = {r["round"]: r["ns_per_launch"] for r in mine if r["config"] == config}
            out[f"{framework}/{config}"] = {
                "ns": statistics.median(ns.values()),
                "paired_ns": statistics.median(ns[k] - none[k] for k in ns),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of every configuration")
    parser.add_argument("--launches", type=int, default=50000, help="timed launches per child")
    parser.add_argument(
        "--frameworks", default="torch,cupy", help="comma-separated: cuda, torch, cupy"
    )
    parser.add_argument("--out", default="", help="where to write every round (JSON)")
    parser.add_argument(
        "--cpus",
        default="",
        metavar="N,N,...",
        help="run every child on those of these cores the machine has (the same cores for "
        "every configuration)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="CONFIG:NAME=VALUE",
        help="also measure a gated configuration with this variable set (repeatable)",
    )
    args = parser.parse_args()
    for v in args.variant:
        config, _, setting = v.partition(":")
        if config not in GATED or "=" not in setting or not setting.split("=", 1)[0]:
            parser.error(f"--variant wants CONFIG:NAME=VALUE (CONFIG: {GATED}), not {v!r}")
    frameworks = args.frameworks.split(",")
    built = libraries(frameworks)
    configs = (*CONFIGS, *args.variant)
    rows = []
    for round_ in range(args.rounds):
        order = [(c, f) for c in configs for f in frameworks]
        random.shuffle(order)
        for config, framework in order:
            try:
                row = one_run(config, framework, args, built)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            rows.append({"round": round_, "config": config, "framework": framework, **row})
    table = summary(rows, frameworks, configs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": table, "rounds": rows, "time": time.time()}, f, indent=1)
    print(f"{'framework/config':<28} {'ns/launch':>10} {'vs none, paired':>16}")
    for key, row in table.items():
        print(f"{key:<28} {row['ns']:>10.0f} {row['paired_ns']:>+16.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
