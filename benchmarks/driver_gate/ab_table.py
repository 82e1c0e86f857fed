"""The table of an ``ab.sh`` run: per variant and scenario, the median [min-max] over its
rounds of the server's P99 against alone, the trainer's kept share (and of the idle time), the
server's busy share and its mean request time; and of Case-A alone after the run, the spread
each variant's rounds saw.

    python3 benchmarks/driver_gate/ab_table.py OUT
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

#: (label, key of a scenario in results.json, the mean of a latency record where a dict)
COLUMNS = (
    ("P99/alone", "a_p99_ratio"),
    ("kept", "b_kept"),
    ("of idle", "b_kept_of_idle"),
    ("busy", "a_busy"),
    ("request ms", "a_service_ms"),
)
SCENARIOS = ("a-alone-after", "gpreempt", "gpreempt-no-request")


def value(scenario: dict, key: str) -> float | None:
    raw = scenario.get(key)
    if isinstance(raw, dict):
        raw = raw.get("mean")
    return float(raw) if isinstance(raw, (int, float)) else None


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def table(out: Path) -> list[str]:
    lines = [f"{'variant':<12} {'scenario':<20} " + " ".join(f"{c:<22}" for c, _ in COLUMNS)]
    for variant in sorted(p for p in out.iterdir() if p.is_dir()):
        runs = sorted(variant.glob("r*/*/results.json"))
        for name in SCENARIOS:
            found = [json.loads(r.read_text())["scenarios"].get(name) for r in runs]
            found = [s for s in found if s]
            if not found:
                continue
            cells = []
            for _, key in COLUMNS:
                values = [v for s in found if (v := value(s, key)) is not None]
                cells.append(f"{spread(values):<22}")
            lines.append(f"{variant.name:<12} {name:<20} " + " ".join(cells) + f" n={len(found)}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python3 benchmarks/driver_gate/ab_table.py OUT (the folder ab.sh wrote)")
        return 2
    print("\n".join(table(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
