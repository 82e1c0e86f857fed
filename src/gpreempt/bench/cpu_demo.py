"""The online/offline scenario on a machine without a GPU, with the signal mechanism.

One CPU core stands in for the shared GPU: both jobs are pinned to it, so they compete for
it the way two processes compete for a GPU. Case-A serves Poisson requests of a fixed
amount of work (its "inference"); Case-B runs "training steps" as fast as it can. The demo
runs Case-A alone, Case-B alone, both without gpreempt and both under gpreempt, and reports
Case-A's latency and Case-B's step rate in each, with their ratios to the alone runs: the
milliseconds of a CPU stand-in move with the machine's load from run to run, the ratios
within one run much less.

    python -m gpreempt.bench.cpu_demo serve --requests N --load L --out FILE
    python -m gpreempt.bench.cpu_demo train --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..names import MechanismName
from .load import poisson_arrivals
from .stats import latency_summary

#: Work units of one Case-A request and one Case-B step (calibrated to milliseconds).
REQUEST_UNITS = 60_000
STEP_UNITS = 200_000


def work(units: int) -> int:
    """A fixed amount of pure-Python arithmetic: the CPU stand-in for a kernel."""
    total = 0
    for i in range(units):
        total += i * i & 0xFF
    return total


def pin_to_one_core() -> None:
    """Share one core, the stand-in for one GPU (the highest-numbered core we may use)."""
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[-1]})


def serve(args: argparse.Namespace) -> None:
    import gpreempt

    pin_to_one_core()
    work(REQUEST_UNITS)  # warm up
    arrivals = poisson_arrivals(args.requests, args.rate, seed=args.seed)
    latencies = []
    start = time.perf_counter() + 0.2
    for offset in arrivals:
        scheduled = start + offset
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        with gpreempt.request():
            work(REQUEST_UNITS)
        latencies.append((time.perf_counter() - scheduled) * 1e3)
    Path(args.out).write_text(json.dumps({"latencies_ms": latencies}))


def train(args: argparse.Namespace) -> None:
    pin_to_one_core()
    steps: list[float] = []
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    Path(args.out + ".ready").write_text("ready")
    while not stop:
        work(STEP_UNITS)
        steps.append(time.time())
    Path(args.out).write_text(json.dumps({"steps": steps}))


def service_ms() -> float:
    """Median time of one Case-A request on this machine, alone, on the shared core."""
    saved = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pin_to_one_core()
    try:
        samples = []
        for _ in range(15):
            t0 = time.perf_counter()
            work(REQUEST_UNITS)
            samples.append((time.perf_counter() - t0) * 1e3)
    finally:
        if saved is not None:  # the daemon and launchers must not share the demo's core
            os.sched_setaffinity(0, saved)
    return sorted(samples)[len(samples) // 2]


def _python(module_args: list[str], runtime_dir: Path, under: list[str] | None) -> list[str]:
    command = [sys.executable, "-m", "gpreempt.bench.cpu_demo", *module_args]
    if under is None:
        return command
    return [
        sys.executable,
        "-m",
        "gpreempt",
        "run",
        "--runtime-dir",
        str(runtime_dir),
        *under,
        "--",
        *command,
    ]


#: The scenarios, in the order they run and are shown.
SCENARIOS = ("a-alone", "b-alone", "co-located", "gpreempt")


def run_scenario(
    name: str, workdir: Path, runtime_dir: Path, requests: int, rate: float
) -> dict[str, Any]:
    """One scenario: Case-A's latencies and Case-B's steps while Case-A ran (``b-alone``:
    Case-B's steps over as long as Case-A's requests take)."""
    managed = name == "gpreempt"
    env = dict(os.environ, GPREEMPT_RUNTIME_DIR=str(runtime_dir))
    b_out = workdir / f"{name}-b.json"
    trainer = None
    if name != "a-alone":
        under = ["--priority", "low", "--mechanism", MechanismName.SIGNAL, "--name", "case-b"]
        trainer = subprocess.Popen(
            _python(["train", "--out", str(b_out)], runtime_dir, under if managed else None),
            env=env,
        )
        deadline = time.time() + 30
        while not Path(str(b_out) + ".ready").exists():
            if time.time() > deadline or trainer.poll() is not None:
                raise RuntimeError("the Case-B process did not start")
            time.sleep(0.02)
        time.sleep(0.5)
    a_out = workdir / f"{name}-a.json"
    under_a = ["--priority", "high", "--name", "case-a"]
    began = time.time()
    if name == "b-alone":
        time.sleep(requests / rate)
    else:
        subprocess.run(
            _python(
                ["serve", "--requests", str(requests), "--rate", str(rate), "--out", str(a_out)],
                runtime_dir,
                under_a if managed else None,
            ),
            env=env,
            check=True,
        )
    ended = time.time()
    steps_per_s = None
    if trainer is not None:
        trainer.send_signal(signal.SIGTERM)
        trainer.wait(30)
        steps = json.loads(b_out.read_text())["steps"]
        inside = [t for t in steps if began <= t <= ended]
        steps_per_s = len(inside) / (ended - began)
    summary = None
    if name != "b-alone":
        summary = latency_summary(json.loads(a_out.read_text())["latencies_ms"])
    return {"scenario": name, "a_latency_ms": summary, "b_steps_per_s": steps_per_s}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's Case-A P99 over Case-A's alone (``a_p99_ratio``) and Case-B's step rate
    over Case-B's alone (``b_kept``), where both are measured."""
    by_name = {row["scenario"]: row for row in rows}
    a_alone = (by_name.get("a-alone", {}).get("a_latency_ms") or {}).get("p99")
    b_alone = by_name.get("b-alone", {}).get("b_steps_per_s")
    for row in rows:
        p99 = (row.get("a_latency_ms") or {}).get("p99")
        steps = row.get("b_steps_per_s")
        row["a_p99_ratio"] = p99 / a_alone if p99 is not None and a_alone else None
        row["b_kept"] = steps / b_alone if steps is not None and b_alone else None


def run_demo(requests: int = 200, load: float = 0.5, progress: Any = None) -> dict[str, Any]:
    """Every scenario (:data:`SCENARIOS`); returns the rows, with their ratios to the alone
    runs, and Case-A's service time."""
    service = service_ms()
    rate = load / (service / 1e3)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpreempt-demo-") as tmp:
        workdir = Path(tmp)
        runtime_dir = workdir / "rt"
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime_dir)],
            stderr=subprocess.DEVNULL,
        )
        try:
            for name in SCENARIOS:
                if progress:
                    progress(name)
                rows.append(run_scenario(name, workdir, runtime_dir, requests, rate))
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
    add_ratios(rows)
    return {"service_ms": service, "rate_per_s": rate, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gpreempt.bench.cpu_demo")
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--requests", type=int, required=True)
    s.add_argument("--rate", type=float, required=True)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=serve)
    t = sub.add_parser("train")
    t.add_argument("--out", required=True)
    t.set_defaults(fn=train)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
