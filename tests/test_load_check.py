"""The bench's check of Case-A's load: the rate correction (pure) and check_load's use of a run
alone, with the run faked."""

from __future__ import annotations

import json

import pytest

from gpreempt.bench import load_check
from gpreempt.bench.load import LOAD_TOLERANCE, corrected_rate, poisson_arrivals
from gpreempt.bench.scenarios import Harness, RawScenario
from gpreempt.bench.workload_argv import Workloads


@pytest.mark.parametrize(
    ("busy", "expected"),
    [
        (0.5, 100.0),  # on target
        (0.5 * (1 + LOAD_TOLERANCE * 0.9), 100.0),  # inside the tolerance
        (0.62, 100.0 * 0.5 / 0.62),  # an eager server slower than at calibration
        (0.40, 100.0 * 0.5 / 0.40),  # faster
        (None, 100.0),  # nothing measured
        (0.0, 100.0),
    ],
)
def test_corrected_rate_scales_by_load_over_busy_outside_the_tolerance(busy, expected):
    assert corrected_rate(100.0, 0.5, busy) == pytest.approx(expected)


def test_scaled_rate_keeps_the_arrivals_shape():
    a, b = poisson_arrivals(50, 100.0, 3), poisson_arrivals(50, 80.0, 3)
    assert b == pytest.approx([x * 100.0 / 80.0 for x in a])


def _harness(tmp_path) -> Harness:
    return Harness(Workloads(), tmp_path / "arrivals.json", 0.0)


def _fake_run(busy_share: float, valid: bool = True):
    """A run_scenario stand-in: requests back to back that cover ``busy_share`` of a 1 s window."""
    seen = {}

    def run(harness, name, directory, b_alone_s):
        seen.update(name=name, span=harness.planned_span_s, b_alone_s=b_alone_s)
        seen["arrivals"] = json.loads(harness.arrivals_file.read_text())
        raw = RawScenario(name, directory, window=(0.0, 1.0))
        starts = [i * 0.1 for i in range(10)]
        raw.serve = {"start": starts, "end": [s + busy_share / 10 for s in starts]}
        if not valid:
            raw.invalidate("Case-A exited with 1")
        return raw

    return run, seen


def test_check_load_corrects_a_server_busier_than_asked(tmp_path, monkeypatch):
    run, seen = _fake_run(0.6)
    monkeypatch.setattr(load_check, "run_scenario", run)
    rate, found = load_check.check_load(_harness(tmp_path), tmp_path / "lc", 0.5, 100.0, 40, 7)
    assert rate == pytest.approx(100.0 * 0.5 / 0.6)
    assert found["a_busy"] == pytest.approx(0.6)
    assert found["rate_calibrated_per_s"] == 100.0 and found["corrected"] is True
    # it served the calibration's arrivals alone, over their whole span
    assert seen["name"] == "a-alone"
    assert seen["arrivals"] == pytest.approx(poisson_arrivals(40, 100.0, 7))
    assert seen["span"] == pytest.approx(seen["arrivals"][-1])


def test_check_load_keeps_the_rate_near_the_load(tmp_path, monkeypatch):
    monkeypatch.setattr(load_check, "run_scenario", _fake_run(0.505)[0])
    rate, found = load_check.check_load(_harness(tmp_path), tmp_path / "lc", 0.5, 100.0, 40, 7)
    assert rate == 100.0 and found["corrected"] is False


def test_a_failed_check_keeps_the_rate_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(load_check, "run_scenario", _fake_run(0.9, valid=False)[0])
    rate, found = load_check.check_load(_harness(tmp_path), tmp_path / "lc", 0.5, 100.0, 40, 7)
    assert rate == 100.0
    assert found["a_busy"] is None and found["corrected"] is False
    assert "exited with 1" in found["invalid_reason"]


def test_the_check_is_said_in_one_sentence():
    from gpreempt.bench.load import describe_load_check

    assert describe_load_check(None, 77.0) == ""
    kept = describe_load_check({"a_busy": 0.5, "corrected": False}, 77.0)
    assert "busy 0.50" in kept and "calibrated rate stands" in kept
    moved = {"a_busy": 0.62, "rate_calibrated_per_s": 77.1, "corrected": True}
    assert "at 77.1 requests/s, so the run used 62.2/s" in describe_load_check(moved, 62.2)
    failed = {"a_busy": None, "corrected": False, "invalid_reason": "Case-A exited with 1"}
    assert "failed (Case-A exited with 1)" in describe_load_check(failed, 77.0)
