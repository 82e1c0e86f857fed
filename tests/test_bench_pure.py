"""The benchmark's pure parts: arrivals, statistics, event log, metrics, report."""

from __future__ import annotations

import json
import statistics

import pytest

from gpreempt.bench import daemon_events, load, report, scenario_metrics, stats
from gpreempt.bench.scenario_catalog import check_scenarios
from gpreempt.bench.scenarios import RawScenario
from gpreempt.errors import UsageError


def test_arrivals_are_fixed_by_seed_and_have_the_asked_rate():
    a = load.poisson_arrivals(20000, 500.0, seed=7)
    assert a == load.poisson_arrivals(20000, 500.0, seed=7)
    assert a != load.poisson_arrivals(20000, 500.0, seed=8)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:], strict=False))
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 500.0, rel=0.03)
    # exponential gaps: the standard deviation equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / 500.0, rel=0.05)


def test_arrival_rate_is_load_over_service_time():
    assert load.arrival_rate(0.5, 0.002) == pytest.approx(250.0)
    for bad in (0.0, -0.1, 2.0):
        with pytest.raises(UsageError, match="load"):
            load.arrival_rate(bad, 0.002)
    with pytest.raises(UsageError):
        load.poisson_arrivals(0, 10.0, 0)


def test_percentile_and_latency_summary():
    values = [float(i) for i in range(1, 101)]
    assert stats.percentile(values, 50) == pytest.approx(50.5)
    assert stats.percentile(values, 99) == pytest.approx(99.01)
    assert stats.percentile([3.0], 99) == 3.0
    summary = stats.latency_summary([1.0, 2.0, 3.0, 4.0])
    assert summary["mean"] == 2.5 and summary["p50"] == 2.5
    assert summary["std"] == pytest.approx(statistics.pstdev([1, 2, 3, 4]))
    assert stats.latency_summary([]) is None
    assert stats.tail_summary([0.1, 0.2, 5.0])["max"] == 5.0


def test_rate_in_window_counts_only_steps_inside():
    steps = [[0.5, 1.0, 1.5, 2.0, 9.0], [1.2, 1.8]]
    assert stats.rate_in_window(steps, 1.0, 2.0) == pytest.approx(5 / 1.0)
    with pytest.raises(ValueError):
        stats.rate_in_window(steps, 2.0, 2.0)


def test_combine_repeats_takes_medians_and_keeps_spread():
    rows = [
        {"valid": True, "a_p99_ratio": 1.0, "a_latency_ms": {"p99": 3.0}, "b_kept": None},
        {"valid": True, "a_p99_ratio": 1.4, "a_latency_ms": {"p99": 5.0}, "b_kept": None},
        {
            "valid": False,
            "invalid_reason": "x",
            "a_p99_ratio": 1.1,
            "a_latency_ms": {"p99": 4.0},
            "b_kept": None,
        },
    ]
    merged = stats.combine_repeats(rows)
    assert merged["a_p99_ratio"] == pytest.approx(1.1)
    assert merged["a_latency_ms"]["p99"] == pytest.approx(4.0)
    assert merged["spread"]["a_p99_ratio"] == {"median": 1.1, "min": 1.0, "max": 1.4, "n": 3}
    assert merged["b_kept"] is None
    assert merged["valid"] is False and merged["invalid_reason"] == "x"
    assert merged["repeats"] == 3


def test_event_log_periods_and_latencies(tmp_path):
    log = tmp_path / "events.jsonl"
    lines = [
        {"t": 10.0, "task": "case-b-0", "event": "suspend", "latency_ms": 0.5},
        {"t": 10.2, "task": "case-b-0", "event": "resume", "latency_ms": 0.1},
        {"t": 10.1, "task": "case-a", "event": "active"},
        {"t": 11.0, "task": "case-b-1", "event": "suspend", "latency_ms": 2.0},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"t": 12, "ev')  # torn line
    events = daemon_events.read_events(log)
    assert len(events) == 4
    assert daemon_events.suspend_latencies_ms(events) == [0.5, 2.0]
    periods = daemon_events.suspended_periods(events, "case-b", end=11.5)
    assert periods == {"case-b-0": [(10.0, 10.2)], "case-b-1": [(11.0, 11.5)]}
    assert daemon_events.suspended_fraction(periods["case-b-0"], 10.0, 11.0) == pytest.approx(0.2)
    assert daemon_events.read_events(tmp_path / "missing.jsonl") == []
    # a rotated log: the previous generation first
    (tmp_path / "events.jsonl.1").write_text(json.dumps({"t": 9.0, "event": "registered"}) + "\n")
    assert [e["t"] for e in daemon_events.read_log(log)][:2] == [9.0, 10.0]


def _raw(name, scheduled, ends, steps=None, events=(), valid=True):
    raw = RawScenario(name, directory=None)  # type: ignore[arg-type]
    if scheduled is not None:
        raw.serve = {"scheduled": scheduled, "start": scheduled, "end": ends}
        raw.window = (min(scheduled), max(ends))
    if steps is not None:
        raw.trains = [{"step_end_t": s} for s in steps]
        if raw.window is None:
            raw.window = (0.0, 1.0)
    raw.events = list(events)
    raw.valid = valid
    return raw


def test_scenario_metrics_against_references():
    due = [0.0, 0.1, 0.2, 0.3]
    alone = _raw("a-alone", due, [t + 0.002 for t in due])
    b_alone = _raw("b-alone", None, None, steps=[[i / 100 for i in range(100)]])
    b_rate = scenario_metrics.b_rate(b_alone)
    assert b_rate == pytest.approx(100.0)
    shared = _raw(
        "gpreempt-signal",
        due,
        [t + 0.004 for t in due],
        steps=[[0.05 + i * 0.01 for i in range(15)]],
        events=[
            {"t": 0.1, "task": "case-b-0", "event": "suspend", "latency_ms": 0.3},
            {"t": 0.15, "task": "case-b-0", "event": "resume"},
        ],
    )
    row = scenario_metrics.scenario_metrics(shared, alone, b_rate)
    assert row["a_p99_ratio"] == pytest.approx(2.0)
    assert row["b_kept"] == pytest.approx(15 / 0.304 / 100.0)
    assert row["a_served"] == pytest.approx(0.302 / 0.304)
    assert row["system_throughput"] == pytest.approx(row["a_served"] + row["b_kept"])
    # Case-A served 4 requests of 4 ms in a 0.304 s window: it left the rest idle
    assert row["a_busy"] == pytest.approx(0.016 / 0.304)
    assert row["b_kept_of_idle"] == pytest.approx(row["b_kept"] / (1 - 0.016 / 0.304))
    assert row["preempt_latency_ms"]["p50"] == pytest.approx(0.3)
    assert row["b_suspended_fraction"] == pytest.approx(0.05 / 0.304)
    ref = scenario_metrics.scenario_metrics(alone, alone, b_rate)
    assert ref["a_p99_ratio"] == 1.0 and ref["b_kept"] == 0.0 and ref["system_throughput"] == 1.0
    assert ref["preempt_latency_ms"] is None and ref["b_kept_of_idle"] is None
    seq = scenario_metrics.sequential_metrics(
        ref, scenario_metrics.scenario_metrics(b_alone, alone, b_rate)
    )
    assert seq["system_throughput"] == 1.0 and seq["b_kept"] == 0.0 and seq["valid"]


def test_steps_that_complete_well_into_case_as_activity_are_counted_late():
    due = [0.0, 0.1, 0.2, 0.3]
    active = [
        {"t": 0.10, "task": "case-a", "event": "active"},
        {"t": 0.20, "task": "case-a", "event": "idle"},
        {"t": 0.25, "task": "case-a", "event": "active"},  # open until the log ends
    ]
    assert daemon_events.active_periods(active, "case-a", 0.30) == [(0.10, 0.20), (0.25, 0.30)]
    # a step every 10 ms: held while Case-A is active, it may finish the one under way (0.105)
    held = [0.05 + i * 0.01 for i in range(6)] + [0.205, 0.215, 0.225, 0.235, 0.245, 0.255]
    leaking = [*held, 0.15, 0.165, 0.28]
    metrics = {}
    for name, steps in (("held", held), ("leaking", leaking)):
        raw = _raw("gpreempt", due, [t + 0.004 for t in due], steps=[sorted(steps)], events=active)
        metrics[name] = scenario_metrics.scenario_metrics(raw, None, None)["b_late_steps"]
    assert metrics == {"held": 0, "leaking": 3}


def test_the_daemons_hold_checks_are_counted():
    events = [
        {"t": 0.1, "task": "case-b-0", "event": "suspend"},
        {"t": 0.2, "task": "case-b-0", "event": "error", "reason": "its suspension does not hold"},
        {"t": 0.2, "task": "case-b-0", "event": "backstop", "mechanism": "lock"},
        {"t": 0.3, "task": "case-b-0", "event": "error", "reason": "something else"},
    ]
    assert scenario_metrics.held_checks(events) == {"hold_leaks": 1, "backstop_stops": 1}
    assert scenario_metrics.held_checks(events[:1]) == {"hold_leaks": 0, "backstop_stops": 0}
    assert daemon_events.late_steps([0.15], [(0.10, 0.20)], 0.01) == [pytest.approx(0.05)]


def test_service_time_leaves_the_queue_out_and_splits_idle_and_queued_arrivals():
    # request 1 arrives at 0.000, starts at once, ends at 0.010; request 2 arrives at 0.005,
    # while 1 runs, so it starts at 0.010; request 3 arrives at 0.050, to an idle server
    serve = {
        "scheduled": [0.0, 0.005, 0.050],
        "start": [0.0, 0.010, 0.051],
        "end": [0.010, 0.014, 0.054],
    }
    assert scenario_metrics.a_service_ms(serve) == pytest.approx([10.0, 4.0, 3.0])
    assert scenario_metrics.a_service_ms(serve, "idle") == pytest.approx([10.0, 3.0])
    assert scenario_metrics.a_service_ms(serve, "busy") == pytest.approx([4.0])
    # busy 10 + 4 + 3 ms of the 54 ms window; a window that cuts request 1 in half counts half
    assert scenario_metrics.a_busy(serve, (0.0, 0.054)) == pytest.approx(17 / 54)
    assert scenario_metrics.a_busy(serve, (0.005, 0.054)) == pytest.approx(12 / 49)
    assert scenario_metrics.a_busy(serve, (0.01, 0.01)) is None


def test_report_has_the_test_plan_tables_and_lists_invalid_scenarios():
    row = {
        "valid": True,
        "a_latency_ms": {"mean": 1, "p50": 1, "p95": 2, "p99": 3, "std": 0.5},
        "a_p99_ratio": 1.0,
        "a_served": 1.0,
        "b_kept": 0.0,
        "b_steps_per_s": 0.0,
        "system_throughput": 1.0,
        "preempt_latency_ms": None,
        "gpu_util": "n/a",
    }
    bad = {**row, "valid": False, "invalid_reason": "case-b-0 exited early"}
    results = {
        "device": {"name": "GPU"},
        "params": {"case_a": "light", "bg": 1, "repeats": 1},
        "scenarios": {
            "a-alone": row,
            "time-sliced": bad,
            "gpreempt-lock": {**row, "preempt_latency_ms": {"p50": 0.1, "p99": 0.2, "max": 0.3}},
        },
    }
    text = report.render(results)
    for heading in (
        "Case-A latency",
        "Throughput: sequential vs concurrent",
        "Preemption",
        "GPU utilisation",
        "Invalid scenarios",
    ):
        assert heading in text
    assert "case-b-0 exited early" in text and "| time-sliced | **no** |" in text


def test_scenario_names_are_checked():
    assert check_scenarios(["mps", "mps", "gpreempt"]) == ("mps", "gpreempt")
    with pytest.raises(UsageError, match="unknown scenario"):
        check_scenarios(["gpreempt-magic"])


def test_serve_args_split_like_a_shell_and_keep_the_scenario_settings() -> None:
    from gpreempt.cli.bench import _serve_args

    assert _serve_args("") == ()
    assert _serve_args("--inflight-budget-ms 1.5 --backstop-ms=0") == (
        "--inflight-budget-ms",
        "1.5",
        "--backstop-ms=0",
    )
    with pytest.raises(UsageError, match="shell words"):
        _serve_args("--inflight-budget-ms '1.5")
    with pytest.raises(UsageError, match="--policy"):
        _serve_args("--policy share")
    with pytest.raises(UsageError, match="--runtime-dir"):
        _serve_args("--runtime-dir=/tmp/x")


def test_one_sides_environment_is_parsed_and_checked() -> None:
    from gpreempt.bench.runner import assignments as _assignments

    assert _assignments(["GPREEMPT_DRIVER_GATE=0", "A=b=c"], "--env-b") == (
        ("GPREEMPT_DRIVER_GATE", "0"),
        ("A", "b=c"),
    )
    for bad in ("NOVALUE", "=1"):
        with pytest.raises(UsageError, match="NAME=VALUE"):
            _assignments([bad], "--env-a")


def test_one_sides_environment_reaches_only_that_side(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpreempt.bench.workload_argv import Workloads

    monkeypatch.delenv("GPREEMPT_DRIVER_GATE", raising=False)
    work = Workloads(env_b=(("GPREEMPT_DRIVER_GATE", "0"),))
    assert work.environment(dict(work.env_b))["GPREEMPT_DRIVER_GATE"] == "0"
    assert "GPREEMPT_DRIVER_GATE" not in work.environment(dict(work.env_a))


def test_the_report_names_suspensions_that_did_not_hold():
    row = {"valid": True, "hold_leaks": 2, "backstop_stops": 2}
    text = report.render({"params": {}, "scenarios": {"gpreempt": row}})
    assert "## Suspensions that did not hold" in text and "`gpreempt`: 2 found" in text
    text = report.render({"params": {}, "scenarios": {"gpreempt": {**row, "hold_leaks": 0}}})
    assert "did not hold" not in text


def test_case_as_gate_counters_say_how_long_its_hook_was_awake():
    """The server's own gates reach results.json: the operator gate's counters, whether it
    slept, and the driver-level gate's launches; nothing where the server ran ungated."""
    driver = {"driver_gate": "on", "driver_launches": 12, "driver_asleep": True}
    gate = {"launches": 5400, "sleeps": 2, "activations": 31, "asleep": True, "waits": 9,
            "driver": driver}  # fmt: skip
    assert scenario_metrics.a_gate_counters({"end": [1.0], "gate": gate}) == {
        "launches": 5400, "sleeps": 2, "activations": 31, "asleep_at_end": True,
        "driver_launches": 12, "driver_asleep_at_end": True,
    }  # fmt: skip
    assert scenario_metrics.a_gate_counters({"gate": {"launches": 3}}) == {
        "launches": 3, "sleeps": 0, "activations": 0, "asleep_at_end": False,
    }  # fmt: skip
    assert scenario_metrics.a_gate_counters({"end": [1.0], "gate": None}) is None
    assert scenario_metrics.a_gate_counters(None) is None
    raw = _raw("gpreempt", [0.0, 0.1], [0.004, 0.104], steps=[[0.01, 0.02]])
    raw.serve["gate"] = gate
    assert scenario_metrics.scenario_metrics(raw, None, None)["a_gate"]["sleeps"] == 2


def test_case_bs_gate_counters_are_summed_over_its_processes():
    """What each trainer's gates counted reaches results.json: summed over the processes, the
    GPU time per launch the driver-level gate spaced its barriers by as the largest."""
    driver = {"driver_gate": "on", "driver_launches": 100, "driver_barriers": 40,
              "driver_waits": 3, "driver_bound_waits": 0, "driver_us_per_launch": 35.0,
              "driver_barriers_checked": 9}  # fmt: skip
    trains = [
        {"gate": {"launches": 15, "barriers_put": 0, "waits": 1, "driver": driver}},
        {"gate": {"launches": 10, "waits": 2, "driver": {**driver, "driver_us_per_launch": 5.0}}},
        {"gate": None},  # a process without a gate
    ]
    counters = scenario_metrics.b_gate_counters(trains)
    assert counters == {
        "launches": 25, "barriers_put": 0, "waits": 3, "driver_launches": 200,
        "driver_barriers": 80, "driver_waits": 6, "driver_bound_waits": 0,
        "driver_barriers_checked": 18, "driver_us_per_launch": 35.0,
    }  # fmt: skip
    only_operator = scenario_metrics.b_gate_counters([{"gate": {"launches": 7}}])
    assert only_operator == {"launches": 7, "barriers_put": 0, "waits": 0}
    assert scenario_metrics.b_gate_counters([{"step_end_t": [1.0]}]) is None
    raw = _raw("gpreempt", [0.0, 0.1], [0.004, 0.104], steps=[[0.01, 0.02]])
    raw.trains[0]["gate"] = trains[0]["gate"]
    assert scenario_metrics.scenario_metrics(raw, None, None)["b_gate"]["driver_launches"] == 100


def test_slow_requests_that_follow_each_other_are_counted_as_stretched():
    """Requests of 1 ms; a run of three at 3 ms (a stretch: two follow a slow one), and a lone
    slow one later: against the alone median, or the run's own where none is given."""
    starts = [0.002 * i for i in range(30)]
    service = [0.001] * 30
    for i in (5, 6, 7, 20):
        service[i] = 0.003
    for i in range(1, 30):
        starts[i] = max(starts[i], starts[i - 1] + service[i - 1])
    ends = [s + d for s, d in zip(starts, service, strict=True)]
    serve = {"scheduled": starts, "start": starts, "end": ends}
    assert scenario_metrics.slow_stretch(serve) == [6, 7]
    assert scenario_metrics.slow_stretch(serve, reference_ms=2.0) == []  # 3 ms is not slow then
    raw = _raw("gpreempt", starts, ends)
    assert scenario_metrics.scenario_metrics(raw, None, None)["a_slow_stretched"] == 2


def test_a_gpu_scripts_modes_are_checked_against_the_known_ones():
    from gpreempt.bench.device import chosen_modes

    assert chosen_modes("a,,c", ("a", "b", "c")) == (["a", "c"], None)
    modes, wrong = chosen_modes("a,z", ("a", "b"))
    assert modes == ["a", "z"] and wrong == "--modes takes a, b; not ['z']"
    assert chosen_modes("", ("a",))[1] == "--modes takes a; not []"
