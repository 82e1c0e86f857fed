"""The rounds of an ``ab.sh`` run, one results.json per variant: each variant's rounds (a run
of one repeat each, ``OUT/NAME/rI/CELL/results.json``) combined as ``gpreempt bench`` combines
repeats (the median of every number, its spread beside it), into ``OUT/NAME/results.json``,
which ``benchmarks/defaults/table.py OUT/NAME`` prints like any cell.

    python3 benchmarks/driver_gate/ab_merge.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpreempt.bench.stats import combine_repeats


def merge(variant: Path) -> bool:
    """Write the variant's combined results.json; False where it has no round."""
    runs = [json.loads(p.read_text()) for p in sorted(variant.glob("r*/*/results.json"))]
    if not runs:
        return False
    names = dict.fromkeys(name for run in runs for name in run["scenarios"])
    scenarios = {
        name: combine_repeats([run["scenarios"][name] for run in runs if name in run["scenarios"]])
        for name in names
    }
    params = {**runs[0].get("params", {}), "repeats": len(runs)}
    merged = {**runs[0], "params": params, "scenarios": scenarios}
    (variant / "results.json").write_text(json.dumps(merged, indent=1))
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python3 benchmarks/driver_gate/ab_merge.py OUT (the folder ab.sh wrote)")
        return 2
    merged = [v for v in sorted(Path(argv[0]).iterdir()) if v.is_dir() and merge(v)]
    print(" ".join(str(v) for v in merged))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
