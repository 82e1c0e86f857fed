"""Where a gated run's P99 comes from: its requests replayed with their service times swapped.

A gated run of ``gpreempt bench`` and the server's run alone in the same repeat served the same
arrivals, request for request. This replays the gated run's arrivals through one server that
serves in order (a request starts at its arrival or when the one before it ends, and takes its
service time) with each request's service taken from the gated run or from the alone one, and
prints the P99 latency (ms) and its ratio to the alone run replayed, for:

* ``gated``: every request as it was served beside the trainer (the replay of the measured run);
* ``alone``: every request as it was served alone (the reference);
* ``idle gated``: the requests that found the server idle beside the trainer as served there,
  the others as alone: what the GPU's switch and the trainer's work in flight cost;
* ``queued gated``: the reverse: what a server slower or faster than alone cost while the
  trainer was held;
* ``alone + switch``: every request as alone, each that finds the server idle in the replay
  ``--switch-ms`` longer (default 0.134, the GPU's switch that ``cold_start.py`` measured): the
  floor for taking turns on the GPU by time slices;
* ``alone x SCALE`` (with ``--scale``): every request as alone, its service time ``--scale``
  times as long: how much the P99 moves for a server that much slower, e.g. by what
  ``request()`` costs its CPU (``--scale 1.01``: per 1 % of its service time).

A run folder is ``runs/rN/SCENARIO`` of a bench (its alone run ``runs/rN/a-alone``) or one kept
by ``run.sh`` (``rN-SCENARIO``, its alone run ``rN-a-alone`` beside it); ``--alone`` names
another. Each holds the server's ``case-a.json``, gzipped or not.

    python3 benchmarks/driver_gate/p99_parts.py [--json] [--switch-ms MS] [--scale X]
        [--alone FOLDER] RUN_FOLDER...
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpreempt.bench.stats import percentile

SWITCH_MS = 0.134  # cold_start.py, h100/context-switch/cold_start-{1,2}.json


def read_server(folder: Path) -> dict[str, list[float]]:
    """The server's requests of one run folder: ``scheduled``, ``start``, ``end`` (unix s)."""
    for path in (folder / "case-a.json", folder / "case-a.json.gz"):
        if path.exists():
            raw = path.read_bytes()
            data = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
            return {k: [float(x) for x in data[k]] for k in ("scheduled", "start", "end")}
    raise SystemExit(f"p99_parts: {folder} has no case-a.json: give a run folder of a bench")


def alone_folder(run: Path) -> Path:
    """The alone run of ``run``'s repeat: ``rN-a-alone`` beside ``rN-SCENARIO``, else
    ``a-alone`` beside ``SCENARIO``."""
    repeat, dash, _ = run.name.partition("-")
    if dash and repeat.startswith("r") and repeat[1:].isdigit():
        return run.with_name(f"{repeat}-a-alone")
    return run.with_name("a-alone")


def replay(
    arrivals: Sequence[float], services: Sequence[float], switch: float = 0.0
) -> list[float]:
    """Latencies of one server serving in order; a request that finds it idle takes ``switch``
    longer (all in the same unit)."""
    latencies, free = [], float("-inf")
    for arrival, service in zip(arrivals, services, strict=True):
        start = max(arrival, free)
        free = start + service + (switch if arrival > free else 0.0)
        latencies.append(free - arrival)
    return latencies


def parts(
    gated: dict[str, list[float]],
    alone: dict[str, list[float]],
    switch_ms: float,
    scale: float | None = None,
) -> dict[str, Any]:
    """The P99 (ms) of each replay, its ratio to the alone one, and how many requests found the
    server idle beside the trainer; ``scale``: also the alone replay that much slower."""
    n = len(gated["scheduled"])
    if len(alone["scheduled"]) != n:
        raise SystemExit(
            f"p99_parts: the gated run served {n} requests and the alone run "
            f"{len(alone['scheduled'])}: give the alone run of the same bench"
        )
    arrivals = [t * 1e3 for t in gated["scheduled"]]
    beside = [(e - s) * 1e3 for s, e in zip(gated["start"], gated["end"], strict=True)]
    own = [(e - s) * 1e3 for s, e in zip(alone["start"], alone["end"], strict=True)]
    ends = gated["end"]
    idle = [i == 0 or gated["scheduled"][i] > ends[i - 1] for i in range(n)]
    services = {
        "gated": beside,
        "alone": own,
        "idle gated": [b if i else a for b, a, i in zip(beside, own, idle, strict=True)],
        "queued gated": [a if i else b for b, a, i in zip(beside, own, idle, strict=True)],
    }
    out = {name: percentile(replay(arrivals, s), 99) for name, s in services.items()}
    out["alone + switch"] = percentile(replay(arrivals, own, switch_ms), 99)
    if scale is not None:
        out[f"alone x {scale:g}"] = percentile(replay(arrivals, [x * scale for x in own]), 99)
    reference = out["alone"]
    result: dict[str, Any] = {
        name: {"p99_ms": value, "of_alone": value / reference} for name, value in out.items()
    }
    result["found_idle"] = sum(idle)
    result["measured_p99_ms"] = percentile(
        [(e - a) * 1e3 for a, e in zip(gated["scheduled"], ends, strict=True)], 99
    )
    result["switch_ms"] = switch_ms
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="gated run folders")
    parser.add_argument("--alone", type=Path, help="the alone run (default: beside each run)")
    parser.add_argument("--switch-ms", type=float, default=SWITCH_MS)
    parser.add_argument(
        "--scale", type=float, help="also every request as alone, this many times as long"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object, by run folder")
    args = parser.parse_args(argv)
    if args.switch_ms < 0:
        parser.error(f"--switch-ms must be 0 or more, got {args.switch_ms}")
    if args.scale is not None and not args.scale > 0:
        parser.error(f"--scale must be more than 0, got {args.scale}")
    results = {}
    for run in args.runs:
        alone = args.alone or alone_folder(run)
        if not alone.is_dir():
            raise SystemExit(f"p99_parts: no alone run at {alone}: name it with --alone FOLDER")
        results[str(run)] = parts(read_server(run), read_server(alone), args.switch_ms, args.scale)
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    for run, r in results.items():
        print(f"{run}: measured P99 {r['measured_p99_ms']:.2f} ms, {r['found_idle']} requests "
              "found the server idle")  # fmt: skip
        names = ["gated", "alone", "idle gated", "queued gated", "alone + switch"]
        for name in names + [n for n in r if n.startswith("alone x ")]:
            print(
                f"  {name:15s} P99 {r[name]['p99_ms']:6.2f} ms  {r[name]['of_alone']:.3f} of alone"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
