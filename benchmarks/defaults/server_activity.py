"""What telling its activity costs an eager server that never calls ``request()``, per way of
telling it, on GPU 0.

A task that preempts others (``gpreempt run --priority high``) and marks no requests is
counted active from its launches: its operator gate (PyTorch's operator hook) or, with
``GPREEMPT_GATE=0``, the driver-level gate (CUDA's launch callbacks) notices each one. An
eager ResNet-50 b8 request runs about 900 operators and a few hundred kernel launches, so
what each costs adds up. Copies of the server take turns on the GPU, in rounds whose order is
shuffled, each serving requests one at a time with exponential gaps (mean 13 ms, about load
0.5), no queue, each request timed from its call to its result on the host:

* ``ungated``: plain ``python``, no gpreempt (started last);
* ``control``: a second plain copy (started first): its ratio is the rounds' noise floor;
* ``operator``: ``gpreempt run --priority high``, the defaults, the operator gate telling its
  activity;
* ``driver``: the same with ``GPREEMPT_GATE=0``, the driver-level gate telling it;
* ``request``: the defaults with each request in ``gpreempt.request()``: its requests tell
  its activity, and its hook may sleep.

Each gated copy has a daemon of its own, with an idle trainer registered below it
(``gpreempt run --priority low``, CUDA started, then asleep), so that its activity is needed.
A configuration's ratio is its median request time over ``ungated``'s in the same round.

    PYTHONPATH=src python3 benchmarks/defaults/server_activity.py --out server_activity.json.gz

Prints a table (each configuration's ratio to ``ungated`` and to ``operator``, per round by
the means of its requests: the median, the spread and the rounds it was faster in; the mean
and median of all its requests) and writes every request's time and each copy's gate
counters to ``--out``; ``--table FILE`` prints the table of a file written before.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpreempt.bench import turns

CONFIGS = ("ungated", "control", "operator", "driver", "request")

CHILD = r"""
import random, sys, time
from pathlib import Path
config, turn_path, me, out_path = sys.argv[1:5]
import torch
import gpreempt
from gpreempt.bench import turns
from gpreempt.bench.builtin_workloads import resnet50_server
from gpreempt.bench.workloads import gate_stats
handle = resnet50_server(8, graph=False)
for _ in range(30):
    handle()
marked = config == "request"
rng = random.Random(me)

def run(key):
    ms = []
    for _ in range(int(key.split(":")[1])):
        time.sleep(rng.expovariate(1 / 0.013))
        start = time.perf_counter()
        if marked:
            with gpreempt.request():
                handle()
        else:
            handle()
        ms.append((time.perf_counter() - start) * 1e3)
    return {"ms": ms, "gate": gate_stats()}

turns.take_turns(Path(turn_path), me, Path(out_path), run)
"""

IDLE_TRAINER = "import torch, time; torch.ones(1, device='cuda').add_(1); time.sleep(100000)"


def measure(rounds: int, requests: int, work: Path) -> list[dict]:
    """Every turn of every configuration, interleaved."""
    env = turns.clean_env()
    procs: list[subprocess.Popen] = []
    turn = work / "turn"
    turn.write_text("")
    ids = {c: f"c{i}" for i, c in enumerate(CONFIGS)}
    outs = {c: work / f"{ids[c]}.jsonl" for c in CONFIGS}

    def child(config: str) -> list[str]:
        return [sys.executable, "-c", CHILD, config, str(turn), ids[config], str(outs[config])]

    try:
        procs.append(subprocess.Popen(child("control"), env=env))
        for config in ("operator", "driver", "request"):
            runtime = work / f"rt-{config}"
            procs.append(turns.start_daemon(runtime, env))
            run = turns.run_under(runtime)
            idle = [*run, "--priority", "low", "--", sys.executable, "-c", IDLE_TRAINER]
            procs.append(subprocess.Popen(idle, env=env))
            server_env = {**env, "GPREEMPT_GATE": "0"} if config == "driver" else env
            procs.append(
                subprocess.Popen([*run, "--priority", "high", "--", *child(config)], env=server_env)
            )
        procs.append(subprocess.Popen(child("ungated"), env=env))
        turns.wait_started(list(outs.values()), procs)
        for r in range(rounds):
            order = list(CONFIGS)
            random.shuffle(order)
            for config in order:
                key = f"{r}:{requests}"
                turns.give_turn(turn, ids[config], key, outs[config], requests * 0.2 + 60)
            print(f"  round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        return [{"config": c, **x} for c in CONFIGS for x in turns.read_lines(outs[c])]
    finally:
        turns.stop_all(turn, procs)


def ratios(turns: list[dict], config: str, against: str = "ungated") -> list[float]:
    """Per round: the mean request time of ``config`` over ``against``'s (the means, since a
    turn's times fall in two modes, about 5 and 7 ms, whose share moves the medians)."""
    mean = {(t["config"], t["turn"]): statistics.mean(t["ms"]) for t in turns if t["ms"]}
    return [
        mean[(config, key)] / mean[(against, key)]
        for (c, key) in mean
        if c == config and (against, key) in mean
    ]


def table(turns: list[dict]) -> str:
    """Per configuration: its ratio to ``ungated`` and to ``operator`` (median [min-max] over
    rounds, and the rounds it was faster in), and the mean and median of all its requests."""
    lines = [f"{'config':9s} {'of ungated':24s} {'of operator':30s} mean / median ms"]
    for config in CONFIGS:
        ms = [m for t in turns if t["config"] == config for m in t["ms"]]
        if not ms:
            continue
        cells = []
        for against in ("ungated", "operator"):
            r = ratios(turns, config, against) if config != against else []
            faster = sum(x < 1 for x in r)
            cells.append(
                f"{statistics.median(r):.3f} [{min(r):.3f}-{max(r):.3f}] {faster}/{len(r)}"
                if r
                else "-"
            )
        lines.append(
            f"{config:9s} {cells[0]:24s} {cells[1]:30s} "
            f"{statistics.mean(ms):.2f} / {statistics.median(ms):.2f}"
        )
    for config in CONFIGS[2:]:
        gates = [t["gate"] for t in turns if t["config"] == config]
        lines.append(f"{config:9s} at the end: {_counters(gates[-1] if gates else None)}")
    return "\n".join(lines)


def _counters(gate: dict | None) -> str:
    """The gates' counters that say who told the activity: the operator hook's launches
    (counted while it was awake), activations and sleeps; the driver-level gate's launches."""
    if not gate:
        return "none in the session (a driver-level gate runs on a channel of its own)"
    said = [f"{k} {gate[k]}" for k in ("launches", "activations", "sleeps", "asleep") if k in gate]
    driver = gate.get("driver") or {}
    said += [f"{k} {v}" for k, v in driver.items() if k in ("driver_launches", "driver_asleep")]
    return ", ".join(said)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=60, help="per configuration and round")
    parser.add_argument("--out", help="write every turn here (JSON, .gz to compress)")
    parser.add_argument("--table", metavar="JSON", help="print the table of a run written before")
    args = parser.parse_args()
    if args.table:
        print(table(_read(Path(args.table))["turns"]))
        return 0
    if not args.out:
        parser.error("--out is required to measure")
    with tempfile.TemporaryDirectory(prefix="gpreempt-server-activity-") as tmp:
        turns = measure(args.rounds, args.requests, Path(tmp))
    _write(Path(args.out), {"rounds": args.rounds, "requests": args.requests, "turns": turns})
    print(table(turns))
    return 0


def _read(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _write(path: Path, result: dict) -> None:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        json.dump(result, f)


if __name__ == "__main__":
    sys.exit(main())
