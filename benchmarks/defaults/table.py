"""Print the defaults' cells from `gpreempt bench` result folders as one table.

Usage: python benchmarks/defaults/table.py DIR [DIR ...]   (each DIR a bench --out folder)
Writes nothing; prints, per cell and scenario, the P99 ratio and B kept as median [min-max]
over the repeats, and how far Case-A alone drifted (a-alone-after's P99 ratio).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _span(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, (int, float)):
        return "n/a"
    spread = row.get("spread", {}).get(key)
    if spread and spread.get("n", 1) > 1:
        return f"{value:.2f} [{spread['min']:.2f}-{spread['max']:.2f}]"
    return f"{value:.2f}"


def rows(folder: Path) -> list[str]:
    results = json.loads((folder / "results.json").read_text())
    params, scenarios = results["params"], results["scenarios"]
    after = scenarios.get("a-alone-after", {})
    cell = (
        f"{folder.name}: Case-A {params['case_a']} load {params['load']}, "
        f"{params['bg']} x {params['case_b']}, {params['repeats']} repeat(s)"
    )
    lines = [f"{cell}; a-alone-after P99 ratio {_span(after, 'a_p99_ratio')}"]
    for name, row in scenarios.items():
        if name in ("a-alone", "b-alone", "sequential", "a-alone-after"):
            continue
        valid = "" if row.get("valid") else f"  INVALID: {row.get('invalid_reason')}"
        lines.append(
            f"  {name:22s} P99 ratio {_span(row, 'a_p99_ratio'):20s} "
            f"B kept {_span(row, 'b_kept'):20s}{valid}"
        )
    return lines


def main(argv: list[str]) -> int:
    for arg in argv:
        folder = Path(arg)
        if not (folder / "results.json").exists():
            print(f"{folder}: no results.json")
            continue
        print("\n".join(rows(folder)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
