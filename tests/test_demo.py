"""`gpreempt demo`: its table shows both jobs alone, the ratios to alone, and one verdict."""

from __future__ import annotations

import io

from rich.console import Console

from gpreempt.bench import cpu_demo
from gpreempt.cli.demo import NAMES, busy_note, show, verdict


def _row(scenario: str, p99: float | None, b: float | None) -> dict:
    return {
        "scenario": scenario,
        "a_latency_ms": None if p99 is None else {"p50": p99 / 2, "p99": p99},
        "b_steps_per_s": b,
    }


def test_ratios_are_to_the_alone_runs() -> None:
    rows = [
        _row("a-alone", 10.0, None),
        _row("b-alone", None, 40.0),
        _row("co-located", 50.0, 20.0),
        _row("gpreempt", 11.0, 19.0),
    ]
    cpu_demo.add_ratios(rows)
    ratios = {r["scenario"]: (r["a_p99_ratio"], r["b_kept"]) for r in rows}
    assert ratios["a-alone"] == (1.0, None) and ratios["b-alone"] == (None, 1.0)
    assert ratios["co-located"] == (5.0, 0.5)
    assert ratios["gpreempt"][0] == 1.1 and ratios["gpreempt"][1] == 19.0 / 40.0


def _table_rows() -> list[dict]:
    return [
        {"scenario": NAMES["a-alone"], "p50": 5.0, "p99": 10.0, "p99_ratio": 1.0}
        | {"b": None, "b_kept": None, "note": ""},
        {"scenario": NAMES["b-alone"], "p50": None, "p99": None, "p99_ratio": None}
        | {"b": 40.0, "b_kept": 1.0, "note": ""},
        {"scenario": NAMES["co-located"], "p50": 20.0, "p99": 50.0, "p99_ratio": 5.0}
        | {"b": 20.0, "b_kept": 0.5, "note": ""},
        {"scenario": NAMES["gpreempt"], "p50": 5.5, "p99": 11.0, "p99_ratio": 1.1}
        | {"b": 19.0, "b_kept": 0.475, "note": ""},
    ]


def test_the_table_shows_case_b_alone_and_says_what_gpreempt_bought() -> None:
    out = io.StringIO()
    show(Console(file=out, width=80), _table_rows())
    text = out.getvalue()
    assert "Case-B alone" in text and "P99/alone" in text and "B/alone" in text
    line = verdict(_table_rows())
    assert line is not None and "1.10x its P99 alone (5.00x without gpreempt)" in line
    assert "kept 0.47 of its speed alone (0.50 without)" in line
    assert " ".join(line.split()) in " ".join(text.split())


def test_a_busy_machine_is_said_so() -> None:
    rows = _table_rows()
    assert busy_note(rows, service_ms=4.0) is None  # 5 ms at the median for 4 ms of work
    assert "busy" in (busy_note(rows, service_ms=2.0) or "")


def test_the_cpu_demo_runs_every_scenario() -> None:
    result = cpu_demo.run_demo(requests=20)
    rows = {r["scenario"]: r for r in result["rows"]}
    assert list(rows) == ["a-alone", "b-alone", "co-located", "gpreempt"]
    assert rows["b-alone"]["b_kept"] == 1.0 and rows["a-alone"]["a_p99_ratio"] == 1.0
    for name in ("co-located", "gpreempt"):
        assert rows[name]["a_p99_ratio"] > 0 and rows[name]["b_kept"] > 0
