"""The launch gate's counters of every Case-B process of one bench run, in one small file.

    python3 benchmarks/defaults/gate_counters.py BENCH_OUT_DIR OUT_JSON

Reads ``runs/r<repeat>/<scenario>/case-b-<i>.json`` under BENCH_OUT_DIR (what each training
process wrote as it stopped) and keeps, per scenario and repeat, the counters that say how its
gate spent the window: how often it slept, the barriers its sleep thread put, how often it woke
because its GPU fell behind its barriers, all the barriers it put (the asleep ones
included) and its waits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COUNTERS = (
    "launches",
    "sleeps",
    "asleep_barriers",
    "backlog_wakes",
    "asleep_drain_ms",
    "asleep_longest_span_ms",
    "barriers_put",
    "waits",
    "wait_seconds",
)


def collect(bench_out: Path) -> dict[str, dict[str, list[dict]]]:
    """{scenario: {"r0": [counters of case-b-0, ...], ...}} for every gated Case-B."""
    found: dict[str, dict[str, list[dict]]] = {}
    for path in sorted(bench_out.glob("runs/r*/*/case-b-*.json")):
        gate = json.loads(path.read_text()).get("gate")
        if not gate:
            continue
        repeat, scenario = path.parent.parent.name, path.parent.name
        row = {key: gate[key] for key in COUNTERS if key in gate}
        found.setdefault(scenario, {}).setdefault(repeat, []).append(row)
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gate_counters.py BENCH_OUT_DIR OUT_JSON", file=sys.stderr)
        return 2
    counters = collect(Path(argv[0]))
    Path(argv[1]).write_text(json.dumps(counters, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
