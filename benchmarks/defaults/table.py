"""Print the defaults' cells from `gpreempt bench` result folders as one table.

Usage: python benchmarks/defaults/table.py DIR [DIR ...]   (each DIR a bench --out folder)
Writes nothing; prints, per cell and scenario, the P99 ratio, Case-A's P99 in ms, B kept and
(where recorded) the share of the window Case-A was busy and B kept of the time it left idle,
as median [min-max] over the repeats, and how far Case-A alone drifted: a-alone-after's P99
ratio, and the range of Case-A's P99 alone over every run of a-alone and a-alone-after (for
a server whose tail moves that much alone, "P99 inside the alone range" is what can be read).
Its service time's P99 too, alone (the same range) and per scenario: a machine on which the
server alone is slower shows there, apart from what the trainer costs it; and, where
recorded, its slow requests in stretches (``a_slow_stretched``), alone and per scenario, and
the median service of the requests that queued behind another, which met a trainer already
held (``a_service_queued_ms``), per scenario.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _span(row: dict, key: str) -> str:
    value: object = row
    for part in key.split("."):  # "a_latency_ms.p99" is a nested value
        value = value.get(part) if isinstance(value, dict) else None
    if not isinstance(value, (int, float)):
        return "n/a"
    spread = row.get("spread", {}).get(key)
    if spread and spread.get("n", 1) > 1:
        return f"{value:.2f} [{spread['min']:.2f}-{spread['max']:.2f}]"
    return f"{value:.2f}"


def _alone_range_ms(scenarios: dict, what: str = "a_latency_ms") -> tuple[float, float] | None:
    """Min and max of Case-A's P99 (ms) of ``what`` (its latency, or its service time) over
    every repeat of a-alone and a-alone-after."""
    values = []
    for name in ("a-alone", "a-alone-after"):
        row = scenarios.get(name, {})
        spread = row.get("spread", {}).get(f"{what}.p99")
        if spread:
            values += [spread["min"], spread["max"]]
        elif (row.get(what) or {}).get("p99") is not None:
            values.append(row[what]["p99"])
    return (min(values), max(values)) if values else None


def rows(folder: Path) -> list[str]:
    results = json.loads((folder / "results.json").read_text())
    params, scenarios = results["params"], results["scenarios"]
    after = scenarios.get("a-alone-after", {})
    cell = (
        f"{folder.name}: Case-A {params['case_a']} load {params['load']}, "
        f"{params['bg']} x {params['case_b']}, {params['repeats']} repeat(s)"
    )
    alone = _alone_range_ms(scenarios)
    alone_text = f"; Case-A alone P99 {alone[0]:.1f}-{alone[1]:.1f} ms" if alone else ""
    service = _alone_range_ms(scenarios, "a_service_ms")
    if service:
        alone_text += f", its service P99 {service[0]:.2f}-{service[1]:.2f} ms"
    slow_alone = [
        scenarios[name]["a_slow_stretched"]
        for name in ("a-alone", "a-alone-after")
        if (scenarios.get(name) or {}).get("a_slow_stretched") is not None
    ]
    if slow_alone:
        alone_text += f", slow stretched alone {max(slow_alone):.0f} at most"
    lines = [f"{cell}; a-alone-after P99 ratio {_span(after, 'a_p99_ratio')}{alone_text}"]
    for name, row in scenarios.items():
        if name in ("a-alone", "b-alone", "sequential", "a-alone-after"):
            continue
        valid = "" if row.get("valid") else f"  INVALID: {row.get('invalid_reason')}"
        p99_ms = (row.get("a_latency_ms") or {}).get("p99")
        inside = ""
        if alone and p99_ms is not None:
            inside = (
                " (above alone)"
                if p99_ms > alone[1]
                else " (below alone)"
                if p99_ms < alone[0]
                else " (inside alone)"
            )
        busy = (
            f" A busy {_span(row, 'a_busy'):20s} kept of idle {_span(row, 'b_kept_of_idle')}"
            if row.get("a_busy") is not None
            else ""
        )
        # steps Case-B completed well into Case-A's activity (scenario_metrics.b_late_steps)
        late = (
            f" B late steps {_span(row, 'b_late_steps')}"
            if row.get("b_late_steps") is not None
            else ""
        )
        # slow requests one after another (scenario_metrics.slow_stretch); runs before it: none
        stretched = (
            f" slow stretched {_span(row, 'a_slow_stretched')}"
            if row.get("a_slow_stretched") is not None
            else ""
        )
        # requests that met a trainer already held; runs before it: none
        queued = (
            f" queued p50 ms {_span(row, 'a_service_queued_ms.p50')}"
            if row.get("a_service_queued_ms") is not None
            else ""
        )
        lines.append(
            f"  {name:22s} P99 ratio {_span(row, 'a_p99_ratio'):20s} "
            f"P99 ms {_span(row, 'a_latency_ms.p99'):22s}{inside} "
            f"B kept {_span(row, 'b_kept'):20s}{busy}{late}"
            f" service P99 ms {_span(row, 'a_service_ms.p99')}{queued}{stretched}{valid}"
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
