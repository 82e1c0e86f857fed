"""One line per bench run directory under DIR and gate scenario in it: Case-A P99 ratio and
Case-B kept.

python3 benchmarks/gate-frontier/table.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    for d in sorted(Path(sys.argv[1]).iterdir()):
        results = d / "results.json"
        if not results.exists():
            continue
        scenarios = json.loads(results.read_text())["scenarios"]
        for name in ("gpreempt-gate", "gpreempt-gate-mps"):
            s = scenarios.get(name)
            if s is None:
                continue
            a = s["a_latency_ms"] or {}
            print(
                f"{d.name:12} {name:18} P99 ratio {s['a_p99_ratio']:.2f}  "
                f"B kept {s['b_kept']:.2f}  "
                f"A P50 {a.get('p50', 0):.2f} ms  A P99 {a.get('p99', 0):.2f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
