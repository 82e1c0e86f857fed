"""Did a trainer's GPU work go on while the server was active? Read from one bench run.

A trainer behind stream barriers may finish only the step the GPU was running when the server
became active: a step that completes later than one step's time into an active period ran
while it should have been held. This reads one scenario's run folder of ``gpreempt bench``
(``runs/rN/SCENARIO``: the server's requests ``case-a.json``, the first trainer's step ends
``case-b-0.json``, the daemon's ``events.jsonl``; each may be gzipped) and prints:

* the trainer's steps that completed inside the server's active periods (from the daemon's
  ``active``/``idle`` events), and how far into the period, against its median step time;
* the service time of requests that queued behind the previous one, split by whether the
  server went idle in between: a server that stays active should serve them as fast as alone.

    python3 benchmarks/driver_gate/held_progress.py RUN_FOLDER
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gpreempt.bench import daemon_events


def _read(folder: Path, name: str) -> Any:
    plain, packed = folder / name, folder / f"{name}.gz"
    if plain.exists():
        text = plain.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        text = ""
    if not text.strip():
        if name.startswith("case-b"):
            raise SystemExit(
                f"held_progress: {folder} holds no trainer's steps ({name}): a "
                "trainer run as a command writes none"
            )
        raise SystemExit(f"held_progress: {folder} has no {name}: give a runs/rN/SCENARIO folder")
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(folder: Path) -> dict[str, Any]:
    """The figures printed by :func:`main`, as a dict."""
    server, trainer = _read(folder, "case-a.json"), _read(folder, "case-b-0.json")
    begin, end = server["start"][0], server["end"][-1]
    periods = daemon_events.active_periods(_read(folder, "events.jsonl"), "case-a", end)
    every = trainer["step_end_t"]
    gaps = [b - a for a, b in zip(every, every[1:], strict=False)]
    step_s = statistics.median(gaps) if gaps else float("nan")
    ends = [t for t in every if begin <= t <= end]
    inside = daemon_events.late_steps(ends, periods, 0.0)  # every step inside a period
    active_s = sum(min(b, end) - max(a, begin) for a, b in periods if b > begin and a < end)
    idle_ends = [p[1] for p in periods]
    split: dict[str, list[float]] = {"stayed active": [], "went idle between": []}
    s, e = server["start"], server["end"]
    for i in range(1, len(s)):
        if s[i] > e[i - 1] + 1e-4:
            continue  # it did not queue: the server was idle when it came
        j = bisect.bisect_left(idle_ends, e[i - 1] - 5e-4)
        went_idle = j < len(idle_ends) and idle_ends[j] < s[i] + 3e-4
        split["went idle between" if went_idle else "stayed active"].append((e[i] - s[i]) * 1e3)
    return {
        "active_share": active_s / (end - begin),
        "steps": len(ends),
        "step_ms": step_s * 1e3,
        "steps_in_active": len(inside),
        "steps_past_one_step": len(daemon_events.late_steps(ends, periods, step_s)),
        "queued_service_ms": {
            k: {"n": len(v), "p50": _q(v, 0.5), "p90": _q(v, 0.9)} for k, v in split.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a runs/rN/SCENARIO folder of gpreempt bench")
    folder = parser.parse_args(argv).folder
    r = summary(folder)
    print(f"server active {r['active_share']:.2f} of the time; trainer step {r['step_ms']:.2f} ms")
    print(
        f"trainer steps completed: {r['steps']}, inside active periods {r['steps_in_active']}, "
        f"of them more than 1.5 steps into the period: {r['steps_past_one_step']}"
    )
    for k, v in r["queued_service_ms"].items():
        print(f"queued requests, server {k}: n={v['n']} service p50 {v['p50']:.2f} ms, "
              f"p90 {v['p90']:.2f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
