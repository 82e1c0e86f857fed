"""Case-A's service time in a bench run, split by how each request started.

A request that starts within 50 us of the previous one's end was queued behind it (a burst);
the others found the server idle. Service = end - start, without the wait in the queue. If
lower tasks slip in between two requests of a burst, the queued requests get slower.

    python3 benchmarks/gate-frontier/back_to_back.py BENCH_OUT_DIR...
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

QUEUED_S = 50e-6


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def split(run: Path) -> dict[str, dict[str, float]]:
    """``{"queued"|"idle": {"n", "p50_ms", "p90_ms"}}`` for one scenario directory."""
    found = sorted(run.glob("case-a.json*"))
    if not found:
        raise SystemExit(f"{run}: no case-a.json: not a bench scenario directory")
    data = _load(found[0])
    start, end = data["start"], data["end"]
    groups: dict[str, list[float]] = {"queued": [], "idle": []}
    for i in range(1, len(start)):
        kind = "queued" if start[i] - end[i - 1] < QUEUED_S else "idle"
        groups[kind].append((end[i] - start[i]) * 1e3)
    return {
        kind: {"n": len(v), "p50_ms": _pct(v, 0.5), "p90_ms": _pct(v, 0.9)}
        for kind, v in groups.items()
        if v
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="bench --out directories")
    args = parser.parse_args()
    for directory in args.dirs:
        for scenario in ("a-alone", "gpreempt-gate"):
            run = directory / "runs" / "r0" / scenario
            if not run.is_dir():
                continue
            parts = split(run)
            text = "  ".join(
                f"{kind} n={p['n']} P50 {p['p50_ms']:.2f} P90 {p['p90_ms']:.2f} ms"
                for kind, p in parts.items()
            )
            print(f"{directory.name:40s} {scenario:14s} {text}")


if __name__ == "__main__":
    main()
