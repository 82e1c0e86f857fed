"""The opt-in scenarios on the CPU: policies, GPUScheduler in one process, memory pressure.

A fake daemon and fake workloads (tests/bench_fakes.py) stand in for the GPU; the fake memory
pool is a JSON file every process shares, and the fake ``gpreempt run --reserve-memory``
"evicts" the other processes' pool memory while the pool is below the reserve.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpreempt.bench import loops, memory_pressure, report, scenario_metrics
from gpreempt.bench.runner import BenchConfig, run_bench
from gpreempt.bench.scenario_catalog import (
    ALL_SCENARIOS,
    DEFAULT_SCENARIOS,
    GATED_ALONE,
    OPT_IN_SCENARIOS,
)
from gpreempt.bench.scenarios import Harness, RawScenario, run_scenario
from gpreempt.bench.workload_argv import Workloads
from gpreempt.errors import UsageError

HERE = Path(__file__).parent
FAKES = HERE / "bench_fakes.py"
GIB = 1 << 30
#: The opt-in scenarios that need no PyTorch (GPUScheduler's launch gate hooks PyTorch: its
#: scenario has a test of its own, skipped without it).
NEW = (
    "gpreempt-timeslice",
    "gpreempt-share",
    "memory-pressure",
    "memory-pressure-baseline",
)


def _workloads(**kw) -> Workloads:
    env = dict(kw.pop("env", {}))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return Workloads(
        case_a_fn="bench_fakes:serve_factory",
        case_b_fn="bench_fakes:train_factory",
        memory_fn="bench_fakes:FakeMemory",
        warmup_s=0.2,
        warmup_steps=3,
        env=tuple(env.items()),
        **kw,
    )


def _probe(free_gib: float = 10.0, checkpoint: bool = True):
    def probe() -> dict:
        return {
            "free": int(free_gib * GIB),
            "total": int(free_gib * GIB),
            "checkpoint_api": checkpoint,
        }

    return probe


def _registered(directory: Path) -> dict[str, list[str]]:
    """task name -> the `gpreempt run` options the fake launcher got."""
    events = [json.loads(x) for x in (directory / "events.jsonl").read_text().splitlines()]
    return {e["task"]: e["argv"] for e in events if e.get("event") == "registered"}


def test_opt_in_scenarios_run_and_report(tmp_path):
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps({"free": 10 * GIB, "held": {}}))
    out = tmp_path / "run"
    config = BenchConfig(
        out_dir=out,
        requests=60,
        scenarios=NEW,
        calibrate_requests=20,
        workloads=_workloads(env={"FAKE_GPU_POOL": str(pool)}),
        gpreempt=(sys.executable, str(FAKES)),
        nvml=False,
        probe_device=False,
        check_load=False,
        ballast_gib=6,
        growth_gib=5,
        memory_settle_s=0.3,
        memory_probe=_probe(10),
    )
    results = run_bench(config)
    rows = results["scenarios"]
    assert list(rows) == ["a-alone", "b-alone", *NEW, "a-alone-after"]
    for name in NEW:
        assert rows[name]["valid"], (name, rows[name]["invalid_reason"])
        assert rows[name]["a_latency_ms"]["p99"] > 0 and rows[name]["b_kept"] > 0.2

    # the daemon's policy and the tasks' options
    runs = out / "runs" / "r0"
    assert "--policy timeslice" in " ".join(
        json.loads((runs / "gpreempt-timeslice/daemon.log").read_text())
    )
    assert "--policy share" in " ".join(
        json.loads((runs / "gpreempt-share/daemon.log").read_text())
    )
    share = _registered(runs / "gpreempt-share")
    assert share["case-b-0"][share["case-b-0"].index("--min-share") + 1] == "0.2"
    assert "--mechanism" not in share["case-b-0"]  # the default, as users run it
    assert "--min-share" not in share["case-a"] and "--mechanism" not in share["case-a"]
    timeslice = _registered(runs / "gpreempt-timeslice")
    assert "--min-share" not in timeslice["case-b-0"]
    assert "--priority" in timeslice["case-a"] and "high" in timeslice["case-a"]
    assert rows["gpreempt-share"]["preempt_latency_ms"]["p50"] == pytest.approx(0.25)

    # memory pressure: Case-A got its memory under gpreempt, ran out of it without
    pressure, baseline = rows["memory-pressure"], rows["memory-pressure-baseline"]
    memory_a = _registered(runs / "memory-pressure")["case-a"]
    assert memory_a[memory_a.index("--reserve-memory") + 1] == "2048MiB"
    assert pressure["a_oom"] is False and baseline["a_oom"] is True
    assert pressure["a_growth_gib"] == pytest.approx(5.0) and baseline["a_growth_gib"] == 0.0
    assert pressure["a_free_before_growth_gib"] == pytest.approx(4.0)
    # Whether Case-A had to wait depends on whether the (fake) eviction already happened at
    # its first request: both are valid runs. Without gpreempt it never waits.
    assert pressure["a_growth_waited_s"] >= 0 and baseline["a_growth_waited_s"] < 0.01
    assert pressure["a_growth_request_ms"] > 0
    evict, restore = pressure["memory_events"]["evict"], pressure["memory_events"]["restore"]
    assert evict["count"] == 1 and evict["gib"] == pytest.approx(6.0)
    assert evict["gb_per_s"] == pytest.approx(6 * GIB / 0.04 / 1e9)
    assert restore["count"] == 1 and restore["seconds"] == pytest.approx(0.05)
    assert baseline["memory_events"] is None
    for row in (pressure, baseline):
        assert row["b_exit_code"] == 0 and row["b_steps_after_restore"] > 0 and row["b_survived"]
    assert pressure["b_restored"] is True and baseline["b_restored"] is None
    assert results["params"]["memory_plan"]["ballast_gib"] == pytest.approx(6.0)

    text = (out / "report.md").read_text()
    assert "## Memory pressure" in text
    assert "| memory-pressure | yes | yes |" in text
    assert "| memory-pressure-baseline | yes | **no (OOM)** |" in text
    assert "| gpreempt-timeslice |" in text


def test_scheduler_scenario_runs_in_one_process(tmp_path):
    pytest.importorskip("torch")  # the scheduler's launch gate hooks PyTorch
    out = tmp_path / "run"
    config = BenchConfig(
        out_dir=out,
        requests=60,
        scenarios=("gpreempt-scheduler",),
        calibrate_requests=20,
        workloads=_workloads(),
        gpreempt=(sys.executable, str(FAKES)),
        nvml=False,
        probe_device=False,
        check_load=False,
    )
    rows = run_bench(config)["scenarios"]
    assert rows["gpreempt-scheduler"]["valid"], rows["gpreempt-scheduler"]["invalid_reason"]
    runs = out / "runs" / "r0"
    # GPUScheduler: one process, no daemon, its own accounting of Case-B's suspended time
    assert not (runs / "gpreempt-scheduler" / "events.jsonl").exists()
    served = json.loads((runs / "gpreempt-scheduler/case-a.json").read_text())
    trained = json.loads((runs / "gpreempt-scheduler/case-b-0.json").read_text())
    assert served["scheduler"] is True and served["pid"] == trained["pid"]
    assert set(trained["scheduler_stats"]) == {"case-a", "case-b"}
    sched = rows["gpreempt-scheduler"]
    assert "| gpreempt-scheduler | n/a |" in (out / "report.md").read_text()
    assert sched["suspensions"] is None and sched["preempt_latency_ms"] is None
    # Case-B's suspended time comes from the scheduler's own statistics.
    assert 0.0 <= sched["b_suspended_fraction"] <= 1.0
    assert trained["scheduler_stats"]["case-b"]["suspended_seconds"] >= 0.0


def _harness(tmp_path: Path, plan: memory_pressure.MemoryPlan | None, **work) -> Harness:
    arrivals = tmp_path / "arrivals.json"
    arrivals.write_text(json.dumps([0.0, 0.01]))
    return Harness(
        _workloads(**work),
        arrivals,
        0.01,
        gpreempt=(sys.executable, str(FAKES)),
        nvml=False,
        memory=plan,
    )


@pytest.mark.parametrize(
    ("name", "probe", "work", "reason"),
    [
        ("memory-pressure", _probe(40, checkpoint=False), {}, "checkpoint API is missing"),
        ("memory-pressure-baseline", _probe(4), {}, "needs at least 8 GiB"),
        ("memory-pressure", _probe(40), {"case_b_cmd": "true"}, "Case-B in Python"),
        ("gpreempt-scheduler", None, {"case_b_cmd": "true"}, "Case-B in Python"),
        ("memory-pressure", None, {}, "free memory was not measured"),
    ],
)
def test_scenarios_that_cannot_run_here_are_invalid_with_the_reason(
    tmp_path, name, probe, work, reason
):
    plan = memory_pressure.make_plan(probe(), 1.0) if probe else None
    raw = run_scenario(_harness(tmp_path, plan, **work), name, tmp_path / name, 1.0)
    assert raw.valid is False and reason in raw.reason
    assert json.loads((tmp_path / name / "scenario.json").read_text())["valid"] is False
    assert not list((tmp_path / name).glob("*.log")), "nothing may have been started"


def test_the_baseline_runs_without_the_checkpoint_api():
    plan = memory_pressure.make_plan(_probe(80, checkpoint=False)(), 3.0)
    assert plan.problem is None and "try_driver() is None" in plan.checkpoint_problem
    assert plan.ballast_bytes == 40 * GIB and plan.growth_bytes == 40 * GIB
    assert plan.reserve_option() == "2048MiB" and plan.growth_at_s == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"ballast_gib": 80}, "does not fit"),
        ({"growth_gib": 78}, "would not fit even with Case-B evicted"),
        ({"ballast_gib": 70, "reserve_gib": 10}, "not below the memory left"),
    ],
)
def test_memory_plans_that_do_not_fit_say_why(options, reason):
    assert reason in memory_pressure.make_plan(_probe(80)(), 3.0, **options).problem


def test_bad_memory_options_are_usage_errors():
    with pytest.raises(UsageError, match="--growth-gib"):
        memory_pressure.make_plan({}, 1.0, growth_gib=-1)
    with pytest.raises(UsageError, match="--growth-at-s"):
        BenchConfig(out_dir=Path("x"), growth_at_s=-1.0).check()


class _Memory:
    """Device memory of ``free`` bytes whose ``free`` grows by ``room`` after ``after`` OOMs."""

    def __init__(self, free: int, room: int = 0, after: int = 10**9) -> None:
        self.free, self.room, self.after, self.ooms = free, room, after, 0

    def free_bytes(self) -> int:
        return self.free

    def allocate(self, nbytes: int) -> int:
        if nbytes > self.free:
            self.ooms += 1
            if self.ooms == self.after:
                self.free += self.room
            raise MemoryError("out of memory")
        self.free -= nbytes
        return nbytes

    def release(self, blocks: list) -> None:
        self.free += sum(blocks)
        blocks.clear()


def test_growth_waits_for_room_or_gives_up_and_keeps_nothing():
    mem = _Memory(free=3 * GIB, room=4 * GIB, after=3)
    held, info = loops.grow_working_set(mem, 5 * GIB, GIB, wait_s=5.0, poll_s=0.001)
    assert sum(held) == 5 * GIB and info["oom"] is False and info["oom_errors"] == 3
    assert info["free_before_bytes"] == 3 * GIB and info["waited_s"] > 0
    mem = _Memory(free=3 * GIB)
    held, info = loops.grow_working_set(mem, 5 * GIB, GIB, wait_s=0.0)
    assert held == [] and info["oom"] is True and info["got_bytes"] == 3 * GIB
    assert mem.free == 3 * GIB, "a failed growth gives back what it got"
    assert loops.growth_index([0.0, 0.1, 0.2, 0.3], 0.15) == 2
    assert loops.growth_index([0.0, 0.1], 5.0) == 1


def test_growth_happens_once_inside_the_chosen_request():
    mem = _Memory(free=2 * GIB)
    growth = loops.Growth(mem, index=1, total=GIB, chunk=GIB // 4, wait_s=0.0)
    calls = []
    request = growth.wrap(lambda: calls.append(mem.free))
    for _ in range(3):
        request()
    assert calls == [2 * GIB, GIB, GIB]
    assert growth.release()["index"] == 1 and mem.free == 2 * GIB


def test_scheduled_role_argv_and_opt_in_lists():
    work = _workloads()
    files = {k: Path(k) for k in ("ready", "go", "arrivals", "out")}
    argv = work.combined_argv(files, {"out": Path("b.json")}, "scheduled")
    assert argv[1:4] == ["-m", "gpreempt.bench.workloads", "scheduled"]
    assert argv[argv.index("--train-fn") + 1] == "bench_fakes:train_factory"
    assert argv[argv.index("--train-out") + 1] == "b.json"
    opt_in = {*NEW, "gpreempt-scheduler"}
    assert set(OPT_IN_SCENARIOS) == {*opt_in, "gpreempt-gate-mps", *GATED_ALONE}
    assert not opt_in & set(DEFAULT_SCENARIOS) and opt_in <= set(ALL_SCENARIOS)
    assert BenchConfig(out_dir=Path("x")).scenarios == DEFAULT_SCENARIOS


def test_memory_metrics_and_report_rows():
    raw = RawScenario("memory-pressure", directory=None)  # type: ignore[arg-type]
    raw.serve = {
        "scheduled": [0.0, 0.1, 0.2],
        "start": [0.0, 0.1, 0.2],
        "end": [0.002, 2.5, 2.502],
        "growth": {
            "index": 1,
            "oom": False,
            "got_bytes": 4 * GIB,
            "free_before_bytes": GIB,
            "asked_bytes": 4 * GIB,
            "seconds": 2.3,
            "waited_s": 2.2,
        },
    }
    raw.window = (0.0, 2.502)
    raw.trains = [{"step_end_t": [0.05, 3.0, 3.1, 3.2]}]
    raw.events = [
        {"t": 0.15, "task": "case-b-0", "event": "evict", "bytes": 8 * GIB, "latency_ms": 2000.0},
        {"t": 2.9, "task": "case-b-0", "event": "restore", "bytes": 8 * GIB, "latency_ms": 1000.0},
    ]
    raw.memory = {"b_exit_codes": [0], "restore_t": 2.9, "progress_from_t": 2.9}
    row = scenario_metrics.scenario_metrics(raw, None, 100.0)
    assert row["a_oom"] is False and row["a_growth_request_ms"] == pytest.approx(2400.0)
    assert row["memory_events"]["evict"]["gb_per_s"] == pytest.approx(8 * GIB / 2.0 / 1e9)
    assert row["memory_events"]["restore"]["seconds"] == pytest.approx(1.0)
    assert row["b_steps_after_restore"] == 3 and row["b_survived"] is True
    raw.memory["b_exit_codes"] = [-9]
    dead = scenario_metrics.scenario_metrics(raw, None, 100.0)
    assert dead["b_survived"] is False
    merged = scenario_metrics.combine_memory_flags({**row}, [row, {**dead, "a_oom": True}])
    assert merged["a_oom"] is True and merged["b_survived"] is False
    text = report.render({"params": {}, "scenarios": {"memory-pressure": {**row, "valid": True}}})
    assert "| memory-pressure | yes | yes | 4.0 | 1.0 | 2400.0 |" in text
    assert "1 / 8.0 / 2.00 / 4.3" in text


def test_cli_help_lists_the_opt_in_scenarios_and_memory_options(capsys):
    from gpreempt.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for word in (
        *NEW,
        "gpreempt-scheduler",
        "opt-in",
        "--scenarios all",
        "--ballast-gib",
        "--growth-gib",
        "--reserve-gib",
        "--growth-at-s",
    ):
        assert word in text, word


def test_cli_passes_all_and_memory_options(monkeypatch, tmp_path):
    from gpreempt.cli import main

    seen = {}
    monkeypatch.setattr("gpreempt.bench.device.gpu_present", lambda: True)
    monkeypatch.setattr(
        "gpreempt.bench.runner.run_bench",
        lambda config: seen.setdefault("c", config) and {"scenarios": {}},
    )
    monkeypatch.setattr("gpreempt.cli.bench.print_summary", lambda *a: None)
    argv = [
        "bench",
        "--scenarios",
        "all",
        "--ballast-gib",
        "30",
        "--growth-gib",
        "35",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 0
    assert seen.pop("c").check_load is True  # on unless turned off
    assert main([*argv[:-1], str(tmp_path / "p"), "--no-load-check"]) == 0
    config = seen["c"]
    assert config.check_load is False
    assert config.scenarios == ALL_SCENARIOS
    assert (config.ballast_gib, config.growth_gib, config.reserve_gib) == (30.0, 35.0, None)


def test_calibration_under_load_measures_what_a_request_takes_at_that_rate():
    """Isolated requests understate a server whose requests slow down when they follow each
    other: the probes at the load's rate report their own service times, not the isolated."""
    import time

    last = [0.0]

    def handle() -> None:  # 1 ms alone, 4 ms when the previous one ended under 20 ms ago
        busy = 0.004 if time.perf_counter() - last[0] < 0.02 else 0.001
        time.sleep(busy)
        last[0] = time.perf_counter()

    service = loops.calibrate_under_load(handle, [1.0] * 30, load=0.5)
    assert len(service) == 30
    assert sum(service) / len(service) > 2.5  # the isolated figure was 1 ms
    assert all(ms >= 0.9 for ms in service)


def test_calibrate_argv_asks_for_the_probe_only_with_a_load(tmp_path):
    workloads = Workloads()
    assert "--calibrate-load" not in workloads.calibrate_argv(tmp_path / "c.json", 10)
    argv = workloads.calibrate_argv(tmp_path / "c.json", 10, 0.5)
    assert argv[argv.index("--calibrate-load") + 1] == "0.5"


def test_a_slow_servers_calibration_probes_are_cut_to_their_span():
    """A server of 10 ms a request at load 0.5 serves 20 requests in 0.4 s: a probe of 0.4 s
    serves no more than those but no fewer than PROBE_LEAST; a fast server all it was given."""
    import time

    calls = [0]

    def slow() -> None:
        calls[0] += 1
        time.sleep(0.01)

    service = loops.calibrate_under_load(slow, [10.0] * 200, load=0.5, rounds=1, probe_s=0.4)
    assert len(service) == calls[0] == loops.PROBE_LEAST
    fast = loops.calibrate_under_load(lambda: None, [0.01] * 200, load=0.5, rounds=1)
    assert len(fast) == 200


def test_the_device_probe_gives_every_field_results_json_keeps() -> None:
    """results.json says of the GPU its name, driver, CUDA and PyTorch versions: the probe,
    run in a child as the bench runs it, gives each of them (None where there is none)."""
    from gpreempt.bench.device import DEVICE_FIELDS, describe

    assert DEVICE_FIELDS == ("name", "driver", "cuda", "torch")
    assert set(DEVICE_FIELDS) <= set(describe())
