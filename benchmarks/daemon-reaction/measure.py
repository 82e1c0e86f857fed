"""How fast the daemon closes lower gates after a more important task's request() begins.

    python3 benchmarks/daemon-reaction/measure.py --out reaction.json [--low 3] [--churn-ms 1]

Runs a private `gpreempt serve`, LOW low-priority processes and one high-priority prober, all
without a GPU. Each low process watches its own control block and time-stamps every closing
of its gate; with --churn-ms it also flips its automatic activity every that many ms, as gated
trainers do when their gate closes and reopens (each flip rings the daemon). The prober opens
a request() after a random pause of 5-15 ms, holds it 2 ms and closes it. The reaction is the
time from the prober's request() entry to each low gate's closing (CLOCK_MONOTONIC, which all
processes share). Writes every sample and prints P50 / P99 / max.
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


def low(args: argparse.Namespace) -> None:
    import gpreempt
    from gpreempt.control import OFF_GATE_INSTALLED

    name = f"low-{os.getpid()}"
    session = gpreempt.attach("low", name=name, gate=False, mechanism="gate", runtime_dir=args.rt)
    control = session.control
    control._set32(OFF_GATE_INSTALLED, 1)  # stands in for a gate: this loop watches the word
    closings: list[int] = []
    deadline = time.monotonic() + args.seconds
    was_closed = control.gate_closed
    next_flip = time.monotonic_ns()
    active = False
    while time.monotonic() < deadline:
        closed = control.gate_closed
        if closed and not was_closed:
            closings.append(time.monotonic_ns())
        was_closed = closed
        if args.churn_ms > 0 and time.monotonic_ns() >= next_flip:
            active = not active
            control.set_auto_active(active)
            next_flip = time.monotonic_ns() + int(args.churn_ms * 1e6)
        time.sleep(20e-6)  # a gate polls its word between sleeps too, once it waits
    Path(args.result).write_text(json.dumps(closings))


def prober(args: argparse.Namespace) -> None:
    import gpreempt

    gpreempt.attach("high", name="prober", gate=False, runtime_dir=args.rt)
    rng = random.Random(0)
    starts: list[int] = []
    time.sleep(1.0)
    for _ in range(args.trials):
        time.sleep(rng.uniform(0.005, 0.015))
        with gpreempt.request():
            starts.append(time.monotonic_ns())
            time.sleep(0.002)
    Path(args.result).write_text(json.dumps(starts))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="gp-react-"))
    rt = work / "rt"
    rt.mkdir(mode=0o700)
    env = {**os.environ, "GPREEMPT_RUNTIME_DIR": str(rt), "PYTHONPATH": str(REPO / "src")}
    serve = [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(rt)]
    daemon = subprocess.Popen(serve, env=env, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    seconds = 2.0 + args.trials * 0.014
    lows = []
    try:
        for i in range(args.low):
            cmd = [sys.executable, str(HERE), "low", "--rt", str(rt), "--seconds", str(seconds)]
            cmd += ["--churn-ms", str(args.churn_ms), "--result", str(work / f"low-{i}.json")]
            lows.append(subprocess.Popen(cmd, env=env))
        cmd = [sys.executable, str(HERE), "prober", "--rt", str(rt), "--trials", str(args.trials)]
        subprocess.run([*cmd, "--result", str(work / "prober.json")], env=env, check=True)
        for proc in lows:
            proc.wait(seconds + 30)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(20)
    starts = json.loads((work / "prober.json").read_text())
    reactions: list[float] = []
    missed = 0
    for i in range(args.low):
        closings = sorted(json.loads((work / f"low-{i}.json").read_text()))
        for start in starts:
            later = [c for c in closings if c >= start]
            if later and later[0] - start < 5e8:
                reactions.append((later[0] - start) / 1e6)
            else:
                missed += 1
    summary = {
        "low": args.low,
        "churn_ms": args.churn_ms,
        "trials": args.trials,
        "samples": len(reactions),
        "missed": missed,
        "p50_ms": _pct(reactions, 0.5),
        "p99_ms": _pct(reactions, 0.99),
        "max_ms": max(reactions),
    }
    Path(args.out).write_text(json.dumps({"summary": summary, "reactions_ms": reactions}))
    print(json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    p = sub.add_parser("low")
    p.add_argument("--rt", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--churn-ms", type=float, default=0.0)
    p.add_argument("--result", required=True)
    p.set_defaults(fn=low)
    p = sub.add_parser("prober")
    p.add_argument("--rt", required=True)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--result", required=True)
    p.set_defaults(fn=prober)
    parser.add_argument("--out", default="reaction.json")
    parser.add_argument("--low", type=int, default=3)
    parser.add_argument("--churn-ms", type=float, default=0.0)
    parser.add_argument("--trials", type=int, default=300)
    parser.set_defaults(fn=run)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
