"""A whole benchmark run on the CPU with fake workloads, a fake daemon and a fake MPS."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from gpreempt.bench.device import DEVICE_FIELDS
from gpreempt.bench.load import corrected_rate, poisson_arrivals
from gpreempt.bench.mps import MpsDaemon
from gpreempt.bench.runner import BenchConfig, run_bench
from gpreempt.bench.workload_argv import Workloads
from gpreempt.cli import main
from gpreempt.errors import UsageError

HERE = Path(__file__).parent
FAKES = HERE / "bench_fakes.py"


def _workloads(**env: str) -> Workloads:
    pythonpath = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return Workloads(
        case_a_fn="bench_fakes:serve_factory",
        case_b_fn="bench_fakes:train_factory",
        warmup_s=0.2,
        warmup_steps=3,
        env=(("PYTHONPATH", pythonpath), *env.items()),
    )


def _config(out: Path, scenarios, workloads: Workloads, **kw) -> BenchConfig:
    return BenchConfig(
        out_dir=out,
        requests=kw.pop("requests", 80),
        scenarios=tuple(scenarios),
        calibrate_requests=30,
        workloads=workloads,
        gpreempt=(sys.executable, str(FAKES)),
        nvml=False,
        probe_device=False,
        check_load=kw.pop("check_load", False),  # on in the full run's test, which checks it
        **kw,
    )


def _registered(directory: Path) -> dict[str, list[str]]:
    """task name -> the `gpreempt run` options and command the fake launcher got."""
    events = [json.loads(x) for x in (directory / "events.jsonl").read_text().splitlines()]
    return {e["task"]: e["argv"] for e in events if e.get("event") == "registered"}


def _fake_mps(tmp_path: Path) -> Path:
    """An nvidia-cuda-mps-control stand-in that logs its calls and their pipe directory."""
    script = tmp_path / "fake-mps-control"
    log = tmp_path / "mps-calls.log"
    script.write_text(
        f'#!/bin/sh\necho "$@|$(cat 2>/dev/null)|$CUDA_MPS_PIPE_DIRECTORY" >> {log}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_full_run_writes_results_report_and_plots(tmp_path):
    out = tmp_path / "run"
    scenarios = [
        "a-alone",
        "b-alone",
        "sequential",
        "time-sliced",
        "stream-priority",
        "mps-priority",
        "gpreempt-signal",
    ]
    env_log = tmp_path / "env"
    env_log.mkdir()
    config = _config(
        out, scenarios, _workloads(FAKE_ENV_LOG=str(env_log)), repeats=2, check_load=True
    )
    config = BenchConfig(**{**config.__dict__, "mps_control": str(_fake_mps(tmp_path))})
    results = run_bench(config)

    saved = json.loads((out / "results.json").read_text())
    assert saved["params"]["requests"] == 80 and saved["params"]["bg"] == 1
    assert set(saved["device"]) == set(DEVICE_FIELDS)
    assert list(saved["scenarios"]) == [*scenarios, "a-alone-after"]
    # Case-A served the arrivals alone once first; the run's rate is the one that check gave
    check, params = saved["params"]["load_check"], saved["params"]
    assert 0 < check["a_busy"] <= 1
    expected = corrected_rate(check["rate_calibrated_per_s"], 0.5, check["a_busy"])
    assert params["arrival_rate_per_s"] == pytest.approx(expected)
    assert check["corrected"] == (expected != check["rate_calibrated_per_s"])
    arrivals = json.loads((out / "arrivals.json").read_text())
    assert arrivals == pytest.approx(poisson_arrivals(80, expected, 0))
    assert json.loads((out / "load_check" / "scenario.json").read_text())["valid"]
    assert "load checked alone first: busy" in (out / "report.md").read_text()
    for name, row in saved["scenarios"].items():
        assert row["valid"], (name, row.get("invalid_reason"))
        assert set(row) >= {
            "a_latency_ms",
            "a_p99_ratio",
            "b_kept",
            "system_throughput",
            "preempt_latency_ms",
            "gpu_util",
            "valid",
            "repeats",
            "spread",
        }
        assert row["repeats"] == 2
    rows = saved["scenarios"]
    assert rows["a-alone"]["a_p99_ratio"] == pytest.approx(1.0)
    assert rows["b-alone"]["b_kept"] == pytest.approx(1.0)
    assert rows["b-alone"]["a_latency_ms"] is None
    assert rows["sequential"]["system_throughput"] == pytest.approx(1.0)
    for name in ("time-sliced", "stream-priority", "gpreempt-signal"):
        assert rows[name]["a_latency_ms"]["p99"] > 0
        assert rows[name]["b_kept"] > 0.3  # a sleeping fake trainer keeps most of its rate
    assert rows["gpreempt-signal"]["preempt_latency_ms"]["p50"] == pytest.approx(0.25)
    assert rows["time-sliced"]["preempt_latency_ms"] is None
    assert results["plots"] == ["latency_cdf.png", "timeline.png"]
    for name in ("latency_cdf.png", "latency_cdf.json", "timeline.png", "timeline.json"):
        assert (out / name).stat().st_size > 0
    text = (out / "report.md").read_text()
    assert "| gpreempt-signal | yes |" in text and "Throughput" in text
    assert "B late" in text  # the trainer's steps late into Case-A's activity, a column
    # the same arrivals in every scenario
    serve = json.loads((out / "runs/r0/time-sliced/case-a.json").read_text())
    alone = json.loads((out / "runs/r1/a-alone/case-a.json").read_text())
    shift = serve["scheduled"][0] - alone["scheduled"][0]
    assert [round(s - shift, 6) for s in serve["scheduled"]] == pytest.approx(
        [round(s, 6) for s in alone["scheduled"]], abs=1e-5
    )
    # MPS: a private daemon in the run directory, started and stopped every time, Case-B only
    # with the low client priority
    calls = (tmp_path / "mps-calls.log").read_text().splitlines()
    assert [c.split("|")[:2] for c in calls] == [["-d", ""], ["", "quit"]] * 2
    assert all(str(out) in c.split("|")[2] for c in calls)
    seen = [json.loads(p.read_text()) for p in env_log.iterdir()]
    assert {s.get("CUDA_MPS_CLIENT_PRIORITY") for s in seen if s} == {"1"}


def test_gate_under_mps_runs_every_process_as_a_client_and_gates_case_b(tmp_path):
    out = tmp_path / "run"
    env_log = tmp_path / "env"
    env_log.mkdir()
    config = _config(out, ["gpreempt-gate-mps"], _workloads(FAKE_ENV_LOG=str(env_log)), requests=40)
    config = BenchConfig(**{**config.__dict__, "mps_control": str(_fake_mps(tmp_path))})
    row = run_bench(config)["scenarios"]["gpreempt-gate-mps"]
    assert row["valid"], row.get("invalid_reason")
    calls = (tmp_path / "mps-calls.log").read_text().splitlines()
    assert [c.split("|")[:2] for c in calls] == [["-d", ""], ["", "quit"]]
    # the trainers of b-alone (no MPS) and of the scenario (a client, below normal)
    seen = sorted((json.loads(p.read_text()) for p in env_log.iterdir()), key=len)
    assert seen[0] == {} and len(seen) == 2
    assert str(out) in seen[1]["CUDA_MPS_PIPE_DIRECTORY"]
    assert seen[1]["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    events = out / "runs" / "r0" / "gpreempt-gate-mps" / "events.jsonl"
    registered = {
        e["task"]: e["argv"]
        for e in map(json.loads, events.read_text().splitlines())
        if e.get("event") == "registered"
    }
    assert registered["case-b-0"][registered["case-b-0"].index("--mechanism") + 1] == "gate"


def test_a_trainer_that_exits_early_makes_the_scenario_invalid(tmp_path):
    work = _workloads(FAKE_TRAIN_EXIT_AFTER_S="0.45", FAKE_SERVICE_S="0.004")
    results = run_bench(_config(tmp_path / "run", ["time-sliced"], work, requests=120))
    row = results["scenarios"]["time-sliced"]
    assert row["valid"] is False
    assert "did not overlap" in row["invalid_reason"] or "exited" in row["invalid_reason"]
    assert "Invalid scenarios" in (tmp_path / "run" / "report.md").read_text()


def test_any_command_can_be_case_b(tmp_path):
    work = Workloads(
        case_a_fn="bench_fakes:serve_factory",
        case_b_cmd=f"{sys.executable} {FAKES} train-cmd",
        warmup_s=0.2,
        env=(("PYTHONPATH", str(HERE)),),
    )
    rows = run_bench(_config(tmp_path / "run", ["time-sliced"], work, requests=60))["scenarios"]
    assert rows["time-sliced"]["valid"], rows["time-sliced"]["invalid_reason"]
    assert rows["b-alone"]["b_steps_per_s"] > 50  # one step per ~5 ms
    assert 0.3 < rows["time-sliced"]["b_kept"] < 1.5


def test_mps_daemon_is_stopped_on_errors(tmp_path):
    control = _fake_mps(tmp_path)
    with pytest.raises(KeyboardInterrupt), MpsDaemon(tmp_path / "d", str(control)):
        raise KeyboardInterrupt
    calls = (tmp_path / "mps-calls.log").read_text().splitlines()
    assert [c.split("|")[:2] for c in calls] == [["-d", ""], ["", "quit"]]


def test_missing_mps_makes_mps_scenarios_invalid_not_fatal(tmp_path):
    config = _config(tmp_path / "run", ["mps"], _workloads(), requests=40)
    config = BenchConfig(**{**config.__dict__, "mps_control": "no-such-mps-control"})
    row = run_bench(config)["scenarios"]["mps"]
    assert row["valid"] is False and "not found" in row["invalid_reason"]


def test_cli_without_gpu_says_so_and_exits_1(monkeypatch, capsys):
    monkeypatch.setattr("gpreempt.bench.device.gpu_present", lambda: False)
    assert main(["bench", "--quick"]) == 1  # could not be done: not bad input
    assert "no NVIDIA GPU" in capsys.readouterr().err


def test_cli_rejects_unknown_scenarios(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("gpreempt.bench.device.gpu_present", lambda: True)
    assert main(["bench", "--scenarios", "a-alone,warp-drive", "--out", str(tmp_path)]) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_cli_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for option in (
        "--load",
        "--requests",
        "--bg",
        "--case-a",
        "--case-a-fn",
        "--case-b-cmd",
        "--scenarios",
        "--repeats",
        "--out",
        "--quick",
        "--no-load-check",
        "mps-priority",
        "gpreempt",
    ):
        assert option in text


def test_several_trainers_share_case_a_runs_alone(tmp_path, monkeypatch):
    """Two Case-B kinds in one run: Case-A calibrated once and alone once before and once after
    each repeat, each trainer's own runs in a directory named after it, whose results.json
    takes the shared runs as its references."""
    out = tmp_path / "run"
    config = _config(
        out,
        ["a-alone", "b-alone", "gpreempt-signal"],
        _workloads(),
        repeats=2,
        case_b_kinds=("transformer", "cupy"),
        requests=40,  # what is checked is where each run goes, not its statistics
    )
    from gpreempt.bench import runner

    calibrations = []
    calibrate = runner.calibrate
    monkeypatch.setattr(
        runner, "calibrate", lambda *a, **k: calibrations.append(1) or calibrate(*a, **k)
    )
    run_bench(config)

    assert len(calibrations) == 1
    for repeat in ("r0", "r1"):
        assert sorted(p.name for p in (out / "runs" / repeat).iterdir()) == [
            "a-alone",
            "a-alone-after",
        ]
        for kind in ("transformer", "cupy"):
            assert sorted(p.name for p in (out / kind / "runs" / repeat).iterdir()) == [
                "b-alone",
                "gpreempt-signal",
            ]
    saved = {k: json.loads((out / k / "results.json").read_text()) for k in ("transformer", "cupy")}
    for kind, results in saved.items():
        assert results["params"]["case_b_together"] == ["transformer", "cupy"]
        rows = results["scenarios"]
        assert list(rows) == ["a-alone", "b-alone", "gpreempt-signal", "a-alone-after"]
        assert all(row["valid"] for row in rows.values()), kind
        assert rows["gpreempt-signal"]["b_kept"] > 0
        assert (out / kind / "report.md").exists()
    a = [r["scenarios"]["a-alone"]["a_latency_ms"] for r in saved.values()]
    assert a[0] == a[1]  # the same runs alone
    b = [r["scenarios"]["gpreempt-signal"]["a_latency_ms"] for r in saved.values()]
    assert b[0] != b[1]  # each trainer's own co-located runs


def test_the_server_alone_under_gpreempt_runs_once_a_repeat_without_a_trainer(tmp_path):
    """``a-alone-gated`` and its no-request twin: Case-A alone under ``gpreempt run --priority
    high`` (marking its requests or not), shared by every trainer of the run as a-alone is,
    with no Case-B started, and its latency read against a-alone."""
    out = tmp_path / "run"
    gated = ["a-alone-gated", "a-alone-gated-no-request"]
    config = _config(
        out, ["a-alone", "b-alone", *gated], _workloads(), case_b_kinds=("transformer", "cupy")
    )
    run_bench(config)

    shared = out / "runs" / "r0"
    assert sorted(p.name for p in shared.iterdir()) == ["a-alone", "a-alone-after", *gated]
    for name, marks in zip(gated, (True, False), strict=True):
        argv = _registered(shared / name)["case-a"]
        assert "high" in argv and not list((shared / name).glob("case-b*")), name
        assert ("--no-request" not in argv) == marks, argv
    for kind in ("transformer", "cupy"):
        rows = json.loads((out / kind / "results.json").read_text())["scenarios"]
        for name in gated:
            assert rows[name]["valid"] and rows[name]["a_p99_ratio"] > 0, rows[name]
            assert rows[name]["b_kept"] == 0.0


def test_a_trainer_with_settings_of_its_own_runs_beside_the_plain_one(tmp_path):
    """``KIND+NAME=VALUE``: the same trainer twice in one run, one with a variable set for its
    processes alone, each in a directory named after its entry, the setting recorded."""
    out, env_log = tmp_path / "run", tmp_path / "env"
    env_log.mkdir()
    variant = "transformer+FAKE_SETTING=1"
    config = _config(
        out,
        ["a-alone", "b-alone", "gpreempt-signal"],
        dataclasses.replace(
            _workloads(FAKE_ENV_LOG=str(env_log)), env_a=(("FAKE_SERVER_SETTING", "2"),)
        ),
        case_b_kinds=("transformer", variant),
        requests=40,  # what is checked is where each run goes and what it was set
    )
    run_bench(config)

    plain = json.loads((out / "transformer" / "results.json").read_text())
    tuned = json.loads((out / variant / "results.json").read_text())
    assert plain["params"]["env_b"] == {} and tuned["params"]["env_b"] == {"FAKE_SETTING": "1"}
    assert plain["params"]["env_a"] == tuned["params"]["env_a"] == {"FAKE_SERVER_SETTING": "2"}
    assert plain["params"]["case_b"] == tuned["params"]["case_b"]
    assert tuned["scenarios"]["gpreempt-signal"]["valid"]
    seen = [json.loads(p.read_text()) for p in env_log.glob("train-*.json")]
    # b-alone and gpreempt-signal, each trainer: half of the trainers' processes had it
    assert sorted(s.get("FAKE_SETTING", "-") for s in seen) == ["-", "-", "1", "1"]


@pytest.mark.parametrize(
    ("case_b", "said"),
    [
        ("transformer+GPREEMPT_DRIVER_GATE", "is not NAME=VALUE"),
        ("transformer+=0", "is not NAME=VALUE"),
        ("warp+GPREEMPT_DRIVER_GATE=0", "is not a built-in trainer"),
    ],
)
def test_cli_a_bad_case_b_entry_is_one_line(monkeypatch, capsys, tmp_path, case_b, said):
    monkeypatch.setattr("gpreempt.bench.device.gpu_present", lambda: True)
    assert main(["bench", "--case-b", case_b, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_trainer_named_twice_is_one_line(tmp_path):
    config = _config(tmp_path / "run", ["a-alone"], _workloads(), case_b_kinds=("cupy", "cupy"))
    with pytest.raises(UsageError, match="named twice"):
        run_bench(config)


def test_a_run_stopped_midway_keeps_the_repeats_it_finished(tmp_path, monkeypatch):
    """A bench stopped (SIGTERM, a time limit) in its second repeat still leaves the first
    repeat's results.json and report, marked as one repeat of the two planned."""
    out = tmp_path / "run"
    config = _config(
        out, ["a-alone", "b-alone", "gpreempt-signal"], _workloads(), repeats=2, requests=40
    )
    from gpreempt.bench import runner

    scenario = runner.run_scenario

    def stop_in_second_repeat(harness, name, where, *args):
        if where.parent.name == "r1":
            raise SystemExit(143)
        return scenario(harness, name, where, *args)

    monkeypatch.setattr(runner, "run_scenario", stop_in_second_repeat)
    with pytest.raises(SystemExit):
        run_bench(config)

    saved = json.loads((out / "results.json").read_text())
    assert saved["params"]["repeats"] == 1 and saved["params"]["repeats_planned"] == 2
    assert saved["scenarios"]["gpreempt-signal"]["valid"]
    assert (out / "report.md").exists() and saved["plots"] == []


def test_a_run_stopped_while_it_draws_keeps_every_repeat(tmp_path, monkeypatch):
    """The plots come last: a bench stopped by its time limit while it draws them (seconds per
    trainer) leaves every trainer's results.json with all its repeats, the plots unnamed."""
    out = tmp_path / "run"
    config = _config(
        out, ["a-alone", "gpreempt-signal"], _workloads(), repeats=2, requests=30,
        case_b_kinds=("transformer", "transformer+FAKE_SETTING=1"),
    )  # fmt: skip
    from gpreempt.bench import runner

    def stopped(*_args):
        raise SystemExit(143)

    monkeypatch.setattr(runner, "all_plots", stopped)
    with pytest.raises(SystemExit):
        run_bench(config)

    for trainer in ("transformer", "transformer+FAKE_SETTING=1"):
        saved = json.loads((out / trainer / "results.json").read_text())
        assert saved["params"]["repeats"] == 2 and saved["plots"] == []
        assert saved["scenarios"]["gpreempt-signal"]["valid"]


def _lingering_mps(tmp_path: Path, on_term: str) -> Path:
    """An nvidia-cuda-mps-control stand-in whose ``-d`` leaves a process of that name behind
    (as the real daemon forks), which does not heed ``quit``; ``on_term``: its TERM trap."""
    script = tmp_path / "bin" / "nvidia-cuda-mps-control"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  -d) "$0" serve </dev/null >/dev/null 2>&1 & ;;\n'
        f"  serve) trap '{on_term}' TERM; while :; do sleep 0.05; done ;;\n"
        "  *) cat >/dev/null ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("on_term", ["exit 0", ""], ids=["terminated", "killed"])
def test_an_mps_daemon_that_outlives_its_quit_is_stopped_all_the_same(
    tmp_path, on_term, monkeypatch
):
    monkeypatch.setattr("gpreempt.bench.mps.QUIT_S", 0.3)
    monkeypatch.setattr("gpreempt.bench.mps.TERM_S", 0.3)
    control = _lingering_mps(tmp_path, on_term)
    daemon = MpsDaemon(tmp_path / "d", str(control))
    other = MpsDaemon(tmp_path / "other", str(control))  # another run's: left alone
    with other, daemon:
        deadline = time.monotonic() + 5
        while len(daemon.processes()) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(daemon.processes()) == 1 and len(other.processes()) == 1
        other_pid = other.processes()[0]
        daemon.stop()
        assert daemon.processes() == []
        assert other.processes() == [other_pid]
    assert other.processes() == []
