"""The defaults' benchmark helpers: the gate counters they keep and the table they print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from conftest import load_script

DEFAULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "defaults"


def _load(name: str) -> ModuleType:
    return load_script(f"benchmarks/defaults/{name}.py")


def _case_b(path: Path, gate: dict | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"steps": 120, "steps_per_s": 17.4, "gate": gate}))


def test_gate_counters_keeps_each_gated_trainers_counters_by_scenario_and_repeat(
    tmp_path: Path,
) -> None:
    gate = {
        "native": True,
        "launches": 666498,
        "sleeps": 3,
        "asleep_barriers": 3051,
        "backlog_wakes": 0,
        "asleep_drain_ms": 0.187,
        "asleep_longest_span_ms": 0.216,
        "barriers_put": 34508,
        "waits": 217,
        "wait_seconds": 0.0275,
        "window": 4096,
        "config": {"barrier_ms": 0.1},
    }
    _case_b(tmp_path / "bench/runs/r0/gpreempt/case-b-0.json", gate)
    _case_b(tmp_path / "bench/runs/r1/gpreempt/case-b-0.json", {**gate, "sleeps": 2})
    _case_b(tmp_path / "bench/runs/r1/gpreempt/case-b-1.json", {**gate, "backlog_wakes": 1})
    _case_b(tmp_path / "bench/runs/r0/b-alone/case-b-0.json", None)  # ungated: left out
    out = tmp_path / "gate_counters.json"

    assert _load("gate_counters").main([str(tmp_path / "bench"), str(out)]) == 0

    counters = json.loads(out.read_text())
    assert set(counters) == {"gpreempt"}
    assert [row["sleeps"] for row in counters["gpreempt"]["r1"]] == [2, 3]
    assert [row["backlog_wakes"] for row in counters["gpreempt"]["r1"]] == [0, 1]
    assert counters["gpreempt"]["r0"][0]["asleep_barriers"] == 3051
    assert "config" not in counters["gpreempt"]["r0"][0]
    assert "window" not in counters["gpreempt"]["r0"][0]


def test_gate_counters_without_its_two_paths_says_how_to_call_it(capsys) -> None:
    assert _load("gate_counters").main([]) == 2
    assert "usage: gate_counters.py BENCH_OUT_DIR OUT_JSON" in capsys.readouterr().err


def test_table_prints_a_committed_cell_with_its_spread_and_the_alone_span() -> None:
    done = subprocess.run(
        [sys.executable, str(DEFAULTS / "table.py"), str(DEFAULTS / "cupy")],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cupy: Case-A light load 0.5, 1 x cupy, 3 repeat(s)")
    assert "Case-A alone P99" in lines[0] and "its service P99" in lines[0]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"gpreempt", "gpreempt-lock"}
    assert "B kept" in rows["gpreempt"] and "[" in rows["gpreempt"]
    assert "service P99 ms" in rows["gpreempt"]


def test_table_prints_the_queued_requests_service_where_the_run_recorded_it(tmp_path) -> None:
    params = {"case_a": "light", "load": 0.5, "bg": 1, "case_b": "stub", "repeats": 1}
    row = {"a_p99_ratio": 1.1, "b_kept": 0.4, "valid": True, "spread": {}}
    cells = {
        "now": {**row, "a_service_queued_ms": {"p50": 1.234}},
        "old": row,  # a run from before the bench recorded it
    }
    for name, scenario in cells.items():
        (tmp_path / name).mkdir()
        results = {"params": params, "scenarios": {"gpreempt": scenario}}
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    done = subprocess.run(
        [sys.executable, str(DEFAULTS / "table.py"), str(tmp_path / "now"), str(tmp_path / "old")],
        capture_output=True,
        text=True,
        check=True,
    )
    now, old = (line for line in done.stdout.splitlines() if line.lstrip().startswith("gpreempt"))
    assert "queued p50 ms 1.23" in now
    assert "queued" not in old


def test_eager_gaps_unions_a_requests_gpu_spans_and_finds_its_idle_gaps() -> None:
    gaps = _load("eager_gaps")
    # kernels at 10-20 and 15-30 overlap, then idle 30-50 and 60-90, the last runs past the end
    busy, idle, lead, tail = gaps.busy_and_gaps((0, 100), [(10, 20), (15, 30), (50, 60), (90, 120)])
    assert (busy, idle, lead, tail) == (40, [20, 30], 10, 0)
    assert gaps.busy_and_gaps((0, 5), [(10, 20)]) is None
    found = gaps.summary([{"wall_us": 100.0}], [20.0, 30.0, 60.0, 90.0])
    assert found["gap_us"]["max"] == 90.0 and found["gap_us"]["count"] == 4
    assert found["idle_share_in_gaps_ge_50us"] == 150.0 / 200.0
