"""Where Case-A's slowest requests fall in a bench run, and what the gate did then.

    python3 benchmarks/gate-frontier/outliers.py BENCH_OUT [SCENARIO]

Reads ``BENCH_OUT/runs/r0/SCENARIO/case-a.json`` (the server's per-request times) and prints
the slowest requests with their arrival time since the first request, their queueing wait and
their service time, and how many of them arrived in the window's first 100 ms. Prints JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def summary(run_dir: Path, worst: int = 12) -> dict:
    serve = json.loads((run_dir / "case-a.json").read_text())
    scheduled, starts, ends = serve["scheduled"], serve["start"], serve["end"]
    t0 = min(scheduled)
    rows = [
        {
            "index": i,
            "arrival_ms": round((s - t0) * 1e3, 2),
            "latency_ms": round((e - s) * 1e3, 3),
            "queued_ms": round((b - s) * 1e3, 3),
            "service_ms": round((e - b) * 1e3, 3),
        }
        for i, (s, b, e) in enumerate(zip(scheduled, starts, ends, strict=True))
    ]
    rows.sort(key=lambda r: r["latency_ms"], reverse=True)
    return {
        "requests": len(rows),
        "slowest": rows[:worst],
        "slowest_in_first_100ms": sum(r["arrival_ms"] < 100 for r in rows[:worst]),
    }


def main() -> int:
    out = Path(sys.argv[1])
    scenario = sys.argv[2] if len(sys.argv) > 2 else "gpreempt-gate"
    print(json.dumps(summary(out / "runs" / "r0" / scenario), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
