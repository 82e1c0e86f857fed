"""How long a high-priority process's first kernel waits behind gated trainers.

    python3 benchmarks/gate-frontier/first_kernel.py --out OUT.json [--trainers 0,1,3]

For each number of trainers (Case-B Transformer training, `gpreempt run --priority low
--mechanism gate`), a high-priority prober (`gpreempt run --priority high`) times, many times
after a random idle pause, how long one tiny kernel takes from launch to completion:

* ``no-hint``: the prober launches without warning; the gate's automatic activity detection
  tells the daemon at the first launch, and the kernel waits for the trainers' in-flight work
  (the preemption latency without a hint);
* ``hint-P``: the prober enters ``gpreempt.request()``, spends P ms preparing on the CPU, then
  launches (the hint closes the trainers' gates while it prepares).

The wait is the round trip minus the median round trip with no trainer. Writes every sample
and a summary to OUT.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


def _env(runtime: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GPREEMPT_RUNTIME_DIR"] = str(runtime)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _gp(runtime: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpreempt", *args, "--runtime-dir", str(runtime)]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# ------------------------------------------------------------------------- child processes
def train(args: argparse.Namespace) -> None:
    """A Case-B trainer: steps until killed; touches --ready after warming up."""
    from gpreempt.bench.workloads import transformer_trainer

    step = transformer_trainer()
    for _ in range(10):
        step().synchronize()
    Path(args.ready).touch()
    while True:
        step()


def probe(args: argparse.Namespace) -> None:
    """The prober: tiny-kernel round trips, in one mode, after random pauses."""
    import torch

    import gpreempt

    x = torch.zeros(1, device="cuda")
    for _ in range(20):
        x.add_(1)
    torch.cuda.synchronize()
    rng = random.Random(args.seed)
    samples = []
    for _ in range(args.trials):
        time.sleep(rng.uniform(0.005, 0.015))
        if args.prep_ms is None:
            start = time.perf_counter()
            x.add_(1)
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) * 1e3)
        else:
            with gpreempt.request():
                _spin(args.prep_ms / 1e3)
                start = time.perf_counter()
                x.add_(1)
                torch.cuda.synchronize()
                samples.append((time.perf_counter() - start) * 1e3)
    Path(args.result).write_text(json.dumps(samples))


# ------------------------------------------------------------------------- orchestration
def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wait(path: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path.name} did not appear within {timeout:.0f} s")
        time.sleep(0.1)


def run(args: argparse.Namespace) -> None:
    modes: list[float | None] = [None, *[float(p) for p in args.prep_ms.split(",")]]
    counts = [int(n) for n in args.trainers.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gp-probe-"))
    runtime = work / "rt"
    runtime.mkdir(mode=0o700)
    env = _env(runtime)
    daemon = subprocess.Popen(_gp(runtime, "serve"), env=env, stderr=open(work / "serve.log", "w"))  # noqa: SIM115
    results: dict = {"trials": args.trials, "settings": []}
    try:
        time.sleep(2)
        for count in counts:
            trainers = []
            for i in range(count):
                ready = work / f"ready-{count}-{i}"
                cmd = _gp(runtime, "run")
                cmd += ["--priority", "low", "--mechanism", "gate", "--name", f"trainer-{i}", "--"]
                cmd += [sys.executable, str(HERE), "train", "--ready", str(ready)]
                trainers.append((subprocess.Popen(cmd, env=env), ready))
            try:
                for _proc, ready in trainers:
                    _wait(ready, 180)
                for prep in modes:
                    result = work / f"probe-{count}-{prep}.json"
                    cmd = _gp(runtime, "run") + ["--priority", "high", "--name", "prober", "--"]
                    cmd += [sys.executable, str(HERE), "probe", "--trials", str(args.trials)]
                    cmd += ["--result", str(result)]
                    cmd += [] if prep is None else ["--prep-ms", str(prep)]
                    subprocess.run(cmd, env=env, check=True, timeout=600)
                    samples = json.loads(result.read_text())
                    mode = "no-hint" if prep is None else f"hint-{prep:g}"
                    results["settings"].append(
                        {"trainers": count, "mode": mode, "samples_ms": samples}
                    )
                    print(f"trainers={count} {mode}: p50 {_percentile(samples, 0.5):.3f} ms")
            finally:
                for proc, _ready in trainers:
                    proc.send_signal(signal.SIGTERM)
                for proc, _ready in trainers:
                    proc.wait(60)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    alone = {
        s["mode"]: _percentile(s["samples_ms"], 0.5)
        for s in results["settings"]
        if s["trainers"] == 0
    }
    rows = []
    for s in results["settings"]:
        base = alone.get(s["mode"], 0.0)
        v = s["samples_ms"]
        row = {
            "trainers": s["trainers"],
            "mode": s["mode"],
            "round_trip_p50_ms": _percentile(v, 0.5),
            "round_trip_p99_ms": _percentile(v, 0.99),
            "wait_p50_ms": _percentile(v, 0.5) - base,
            "wait_p99_ms": _percentile(v, 0.99) - base,
        }
        rows.append(row)
    results["summary"] = rows
    Path(args.out).write_text(json.dumps(results, indent=1))
    header = ("trainers", "mode", "rt p50", "rt p99", "wait p50", "wait p99")
    print("{:>8} {:>10} {:>8} {:>8} {:>9} {:>9}".format(*header))
    for r in rows:
        print(
            f"{r['trainers']:>8} {r['mode']:>10} {r['round_trip_p50_ms']:>8.3f} "
            f"{r['round_trip_p99_ms']:>8.3f} {r['wait_p50_ms']:>9.3f} {r['wait_p99_ms']:>9.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    p = sub.add_parser("train")
    p.add_argument("--ready", required=True)
    p.set_defaults(fn=train)
    p = sub.add_parser("probe")
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--prep-ms", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", required=True)
    p.set_defaults(fn=probe)
    parser.add_argument("--out", default="first_kernel.json")
    parser.add_argument("--trainers", default="0,1,3", help="trainer counts (default 0,1,3)")
    parser.add_argument("--prep-ms", default="0,0.5,1", help="CPU preparation after the hint")
    parser.add_argument("--trials", type=int, default=300)
    parser.set_defaults(fn=run)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
