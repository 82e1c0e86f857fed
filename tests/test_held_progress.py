"""benchmarks/driver_gate/held_progress.py: a trainer's steps that completed while the server
was active, and the service of requests that queued, from one bench run folder."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import ModuleType

import pytest
from conftest import load_script


def _load() -> ModuleType:
    return load_script("benchmarks/driver_gate/held_progress.py")


def _run(folder: Path, *, leak: bool) -> None:
    """Two requests, the second queued behind the first while the server stays active from
    t=10.000 to t=10.020; a trainer step of 1 ms, which (leak) goes on completing inside."""
    server = {"start": [10.000, 10.008], "end": [10.008, 10.020], "scheduled": [10.0, 10.001]}
    steps = [9.990 + 0.001 * i for i in range(10)] + [10.0205 + 0.001 * i for i in range(5)]
    if leak:
        steps += [10.005, 10.012]
    events = [
        {"t": 10.0, "task": "case-a", "event": "active"},
        {"t": 10.0001, "task": "case-b-0", "event": "suspend"},
        {"t": 10.020, "task": "case-a", "event": "idle"},
    ]
    folder.mkdir(parents=True)
    (folder / "case-a.json").write_text(json.dumps(server))
    (folder / "case-b-0.json").write_text(json.dumps({"step_end_t": sorted(steps)}))
    text = "".join(json.dumps(e) + "\n" for e in events)
    (folder / "events.jsonl.gz").write_bytes(gzip.compress(text.encode()))


@pytest.mark.parametrize("leak", [False, True])
def test_steps_completed_well_into_an_active_period_are_counted(tmp_path: Path, leak: bool):
    _run(tmp_path / "run", leak=leak)
    r = _load().summary(tmp_path / "run")
    assert r["steps_in_active"] == (2 if leak else 0)
    assert r["steps_past_one_step"] == (2 if leak else 0)
    queued = r["queued_service_ms"]["stayed active"]
    assert queued["n"] == 1 and queued["p50"] == pytest.approx(12.0)
    assert r["reaction_ms"]["n"] == 1 and r["reaction_ms"]["max"] == pytest.approx(0.1)
    assert r["late_after_a_gap"] == 0


@pytest.mark.parametrize("leak", [False, True])
def test_steps_completed_inside_the_servers_busy_span_by_its_own_clock(tmp_path, leak, capsys):
    """The server is busy from 10.000 to 10.020 by its requests' own times; a held trainer
    completes nothing inside, a leaking one two steps, the last 12 ms in."""
    _run(tmp_path / "run", leak=leak)
    h = _load().summary(tmp_path / "run")["held_spans"]
    assert h["n"] == 1 and h["join_ms"] == pytest.approx(0.05)  # a marked server: its linger
    assert h["most_steps"] == (2 if leak else 0)
    if leak:
        assert h["last_of_several_ms"] == pytest.approx(12.0)
    _load().main([str(tmp_path / "run")])
    assert "most trainer steps completed inside one" in capsys.readouterr().out


def test_a_server_that_marks_nothing_is_busy_across_gaps_under_its_idle_grace() -> None:
    server = {"start": [1.0, 1.0021, 1.0100], "end": [1.002, 1.004, 1.012]}
    h = _load().held_spans(server, [1.003, 1.0035, 1.011], join_ms=0.2)
    assert h["n"] == 2 and h["most_steps"] == 2  # 0.1 ms between the first two: one span
    assert h["last_of_several_ms"] == pytest.approx(3.5)


def test_steps_stamped_at_once_by_a_stalled_host_count_as_one_at_the_gpus_pace() -> None:
    """Steps of 1 ms: five stamps 0.05 ms apart inside one span were stamped late by the host
    (the GPU runs no five steps in 0.2 ms); two stamps a step apart are two."""
    server = {"start": [1.0], "end": [1.010]}
    burst = [1.002 + 0.00005 * i for i in range(5)]
    h = _load().held_spans(server, burst, join_ms=0.2, step_ms=1.0)
    assert h["most_steps"] == 5 and h["most_steps_paced"] == 1
    h = _load().held_spans(server, [1.002, 1.003], join_ms=0.2, step_ms=1.0)
    assert h["most_steps"] == 2 and h["most_steps_paced"] == 2
    h = _load().held_spans(server, burst, join_ms=0.2)  # no step time: none told apart
    assert h["most_steps_paced"] == 5


def test_late_steps_after_a_gap_between_requests_are_told_apart(tmp_path: Path):
    """The server idles 2 ms between its two requests inside one of the daemon's periods: of
    the two late steps, the one after that gap ran rightly."""
    _run(tmp_path / "run", leak=True)
    server = {"start": [10.000, 10.006], "end": [10.004, 10.020], "scheduled": [10.0, 10.006]}
    (tmp_path / "run" / "case-a.json").write_text(json.dumps(server))
    r = _load().summary(tmp_path / "run")
    assert r["steps_past_one_step"] == 2 and r["late_after_a_gap"] == 1


def test_the_daemons_reaction_counts_each_active_period_once(tmp_path: Path):
    """Two active periods; the trainer is suspended 0.2 ms into the first and 5 ms into the
    second; a suspend after an idle (another period's) is not counted."""
    _run(tmp_path / "run", leak=False)
    events = [
        {"t": 10.0, "task": "case-a", "event": "active"},
        {"t": 10.0002, "task": "case-b-0", "event": "suspend"},
        {"t": 10.0003, "task": "case-b-1", "event": "suspend"},
        {"t": 10.004, "task": "case-a", "event": "idle"},
        {"t": 10.005, "task": "case-b-0", "event": "suspend"},
        {"t": 10.010, "task": "case-a", "event": "active"},
        {"t": 10.015, "task": "case-b-0", "event": "suspend"},
        {"t": 10.020, "task": "case-a", "event": "idle"},
    ]
    text = "".join(json.dumps(e) + "\n" for e in events)
    (tmp_path / "run" / "events.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    lag = _load().summary(tmp_path / "run")["reaction_ms"]
    assert lag["n"] == 2 and lag["max"] == pytest.approx(5.0)


def test_a_folder_without_the_run_files_gets_one_line(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _load().main([str(tmp_path)])
    assert "has no case-a.json" in str(exit_info.value)


def test_a_trainer_that_wrote_no_steps_gets_one_line(tmp_path: Path):
    """A command trainer (the C++ one) writes no step times; its folder may hold an empty file."""
    _run(tmp_path / "run", leak=False)
    (tmp_path / "run" / "case-b-0.json").unlink()
    (tmp_path / "run" / "case-b-0.json.gz").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        _load().main([str(tmp_path / "run")])
    assert "holds no trainer's steps" in str(exit_info.value)


def test_slow_requests_in_a_stretch_and_the_trainer_step_over_it(tmp_path: Path, capsys):
    """Requests of 1 ms, then three of 3 ms one after another while the trainer's step takes
    50 ms (held, the GPU shared): the stretch is found; without events only that part prints."""
    starts = [10.0 + 0.002 * i for i in range(20)]
    service = [0.001] * 20
    for i in (10, 11, 12):
        service[i] = 0.003
    for i in range(11, 20):  # the slow ones push the rest later
        starts[i] = max(starts[i], starts[i - 1] + service[i - 1])
    ends = [s + d for s, d in zip(starts, service, strict=True)]
    server = {"scheduled": [10.0 + 0.002 * i for i in range(20)], "start": starts, "end": ends}
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "case-a.json").write_text(json.dumps(server))
    steps = [9.95, 9.96, 9.97, 9.98, 10.0, 10.01, 10.06, 10.07]
    (folder / "case-b-0.json").write_text(json.dumps({"step_end_t": steps}))
    r = _load().summary(folder)
    assert r["slow"]["slow"] == 3 and r["slow"]["in_stretches"] == 2
    assert r["slow"]["queued"] == 2  # the first found the server idle
    assert r["slow"]["longest_step_ms"] == pytest.approx(50.0)
    assert r["slow"]["longest_request_ms"] == pytest.approx(3.0)
    assert "active_share" not in r
    assert _load().main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert "3 (2 queued behind another), in stretches 2" in out and "server active" not in out


def _slow_run(folder: Path) -> dict:
    """Ten requests of 1 ms every 4 ms from t=10, the fifth one of 3 ms."""
    starts = [10.0 + 0.004 * i for i in range(10)]
    ends = [s + (0.003 if i == 4 else 0.001) for i, s in enumerate(starts)]
    server = {"scheduled": starts, "start": starts, "end": ends}
    folder.mkdir()
    (folder / "case-a.json").write_text(json.dumps(server))
    (folder / "case-b-0.json").write_text(json.dumps({"step_end_t": [9.9, 10.0, 10.1]}))
    return server


def test_the_gpus_clocks_while_the_slow_requests_ran(tmp_path: Path, capsys):
    """gpu_clocks.py's samples, gzipped, one every 0.5 ms: at 1200 MHz with a throttling reason
    (4) while the slow request ran, at 1980 with none otherwise; those outside any request
    count nowhere."""
    server = _slow_run(tmp_path / "run")
    slow = (server["start"][4], server["end"][4])
    rows = []
    for k in range(90):
        t = 9.99525 + 0.0005 * k
        mhz, reason = (1200, 4) if slow[0] <= t <= slow[1] else (1980, 0)
        rows.append(json.dumps([t, mhz, 300000, 40, reason, 50]))
    clocks = tmp_path / "clocks.jsonl.gz"
    clocks.write_bytes(gzip.compress(("\n".join(reversed(rows)) + "\n").encode()))
    assert _load().main(["--json", "--clocks", str(clocks), str(tmp_path / "run")]) == 0
    (r,) = json.loads(capsys.readouterr().out).values()
    assert r["clocks"]["slow"] == {
        "samples": 6, "sm_mhz_p50": 1200, "sm_mhz_min": 1200, "power_w_p50": 300,
        "reasons": [4]}  # fmt: skip
    idle = r["clocks"]["found idle"]
    assert idle["sm_mhz_min"] == 1980 and idle["reasons"] == [0] and idle["samples"] == 9 * 2
    assert r["clocks"]["queued"]["samples"] == 0  # every request came 4 ms after the one before
    assert _load().main(["--clocks", str(clocks), str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "the slow requests ran: 6 samples, SM clock median 1200 MHz" in out


def test_the_gpus_clock_and_power_while_the_queued_requests_ran(tmp_path: Path):
    """The eighth request, due before the seventh ended, queued (the trainer held all along):
    the samples taken while it ran (at 1800 MHz, 650 W) count for the queued requests, apart
    from those taken while the others found the server idle (1980 MHz, 300 W)."""
    server = _slow_run(tmp_path / "run")
    server["scheduled"] = [*server["start"][:7], server["start"][6] + 0.0005, *server["start"][8:]]
    (tmp_path / "run" / "case-a.json").write_text(json.dumps(server))
    queued = (server["start"][7], server["end"][7])
    rows = []
    for k in range(90):
        t = 9.99525 + 0.0005 * k
        mhz, mw = (1800, 650000) if queued[0] <= t <= queued[1] else (1980, 300000)
        rows.append(json.dumps([t, mhz, mw, 40, 0, 50]))
    clocks = tmp_path / "clocks.jsonl"
    clocks.write_text("\n".join(rows) + "\n")
    r = _load().summary(tmp_path / "run", clocks=_load().read_clocks(clocks))["clocks"]
    q = r["queued"]
    assert (q["samples"], q["sm_mhz_p50"], q["power_w_p50"]) == (2, 1800, 650)
    assert (r["found idle"]["sm_mhz_min"], r["found idle"]["power_w_p50"]) == (1980, 300)


def test_a_slow_requests_gpu_span_tells_a_shared_gpu_from_a_late_start(tmp_path: Path, capsys):
    """The fifth request took 3 ms of which its GPU span 2.9 (the GPU shared while it ran); the
    others 1 ms with a span of 0.9, but the eighth, due before the seventh ended (it queued),
    0.7."""
    server = _slow_run(tmp_path / "run")
    server["gpu_ms"] = [2.9 if i == 4 else 0.7 if i == 7 else 0.9 for i in range(10)]
    server["scheduled"] = [*server["start"][:7], server["start"][6] + 0.0005, *server["start"][8:]]
    (tmp_path / "run" / "case-a.json").write_text(json.dumps(server))
    spans = _load().summary(tmp_path / "run")["gpu_ms"]
    assert spans["slow"]["n"] == 1 and spans["slow"]["gpu_p50"] == pytest.approx(2.9)
    assert spans["slow"]["outside_p50"] == pytest.approx(0.1)
    assert spans["found idle"]["n"] == 8 and spans["found idle"]["gpu_p50"] == pytest.approx(0.9)
    assert spans["queued"]["n"] == 1 and spans["queued"]["gpu_p50"] == pytest.approx(0.7)
    assert spans["queued"]["outside_p50"] == pytest.approx(0.3)
    assert _load().main([str(tmp_path / "run")]) == 0
    assert "GPU span of the slow requests (n=1): median 2.90 ms" in capsys.readouterr().out


def test_the_hosts_cpu_while_the_slow_requests_ran(tmp_path: Path, capsys):
    """gpu_clocks.py's host fields, a sample every 0.5 ms, but every 1 ms while the slow
    request ran, each of those samples with 20 tasks runnable, 250 us more of some task
    waiting for a CPU, 0.1 ms more stolen and 0.05 ms more throttled (over the 2.5 ms from the
    sample before the request: 0.3 of the time, 120 and 60 ms/s); at other times 2 runnable
    and no wait; the sampler woke 2 ms late, read NVML in 0.5 ms and ran its CPU probe in
    40 us while the slow request ran, against 0.05, 0.2 and 20 at other times. An older
    file, without them, prints no host line."""
    server = _slow_run(tmp_path / "run")
    slow = (server["start"][4], server["end"][4])
    rows, stall, steal, throttled, t = [], 0, 0.0, 0.0, 9.99525
    for _ in range(90):
        busy = slow[0] <= t <= slow[1]
        stall, steal = stall + (250 if busy else 0), steal + (1e-4 if busy else 0.0)
        throttled += 5e-5 if busy else 0.0
        rows.append(
            json.dumps(
                [t, 1980, 300000, 40, 0, 50, 20 if busy else 2, stall, steal, throttled]
                + ([2.0, 0.5, 40.0] if busy else [0.05, 0.2, 20.0])
            )
        )
        t += 0.001 if busy else 0.0005
    clocks = tmp_path / "clocks.jsonl"
    clocks.write_text("\n".join(rows) + "\n")
    r = _load().summary(tmp_path / "run", clocks=_load().read_clocks(clocks))
    host = r["host"]
    assert host["slow"]["samples"] == 3 and host["slow"]["runnable_p50"] == 20
    assert host["slow"]["cpu_wait_share"] == pytest.approx(0.3)
    assert host["slow"]["steal_ms_per_s"] == pytest.approx(120.0)
    assert host["slow"]["throttled_ms_per_s"] == pytest.approx(60.0)
    assert host["slow"]["sampler_period_ms_p50"] == pytest.approx(1.0)
    other = host["found idle"]
    assert other["runnable_p50"] == 2 and other["cpu_wait_share"] == 0
    assert other["sampler_period_ms_p50"] == pytest.approx(0.5)
    assert (host["slow"]["sleep_late_ms_p50"], other["sleep_late_ms_p50"]) == (2.0, 0.05)
    assert (host["slow"]["nvml_read_ms_p50"], other["nvml_read_ms_p50"]) == (0.5, 0.2)
    assert (host["slow"]["cpu_probe_us_p50"], other["cpu_probe_us_p50"]) == (40, 20)
    assert _load().main(["--clocks", str(clocks), str(tmp_path / "run")]) == 0
    assert (
        "slow requests ran: 3 samples, runnable tasks median 20, some task waiting for a "
        "CPU 30.0 % of the time, stolen 120.0 ms/s, throttled 60.0 ms/s, the sampler's period "
        "1.0 ms (woke 2.00 ms late, NVML reads 0.50 ms, CPU probe 40 us)" in capsys.readouterr().out
    )
    alone = tmp_path / "alone"  # the server's run alone: its requests and the host beside them
    alone.mkdir()
    (alone / "case-a.json").write_text((tmp_path / "run" / "case-a.json").read_text())
    r = _load().summary(alone, clocks=_load().read_clocks(clocks))
    assert r["slow"]["slow"] >= 1 and "active_share" not in r
    assert json.dumps(r["host"]) == json.dumps(host)  # (no queued request: NaN, which != NaN)
    assert _load().main(["--clocks", str(clocks), str(alone)]) == 0
    out = capsys.readouterr().out
    assert "requests over" in out and "trainer" not in out and "host while the slow" in out
    clocks.write_text("\n".join(json.dumps(json.loads(row)[:6]) for row in rows) + "\n")
    assert _load().main(["--clocks", str(clocks), str(tmp_path / "run")]) == 0
    assert "host while" not in capsys.readouterr().out


def test_the_daemons_suspend_calls_beside_the_slow_requests(tmp_path: Path, capsys):
    """A suspend call made 0.5 ms before the slow request took 0.3 ms; two others 0.02."""
    server = _slow_run(tmp_path / "run")
    events = [
        {"t": server["start"][1], "task": "case-b-0", "event": "suspend", "latency_ms": 0.02},
        {"t": server["start"][4] - 5e-4, "task": "case-b-0", "event": "suspend",
         "latency_ms": 0.3},
        {"t": server["start"][7], "task": "case-b-0", "event": "suspend", "latency_ms": 0.02},
        {"t": server["start"][8], "task": "case-b-0", "event": "resume", "latency_ms": 5.0},
    ]  # fmt: skip
    text = "".join(json.dumps(e) + "\n" for e in events)
    (tmp_path / "run" / "events.jsonl").write_text(text)
    calls = _load().summary(tmp_path / "run")["suspend_calls_ms"]
    assert calls["slow"] == {"n": 1, "p50": 0.3, "max": 0.3}
    assert calls["other"] == {"n": 2, "p50": 0.02, "max": 0.02}
    assert _load().main([str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "suspend calls during the slow requests: n=1, median 0.300 ms" in out


def test_a_clocks_file_that_is_not_one_gets_one_line(tmp_path: Path):
    _slow_run(tmp_path / "run")
    (tmp_path / "clocks.txt").write_text("SM clock 1980\n")
    with pytest.raises(SystemExit) as exit_info:
        _load().main(["--clocks", str(tmp_path / "clocks.txt"), str(tmp_path / "run")])
    assert "is not gpu_clocks.py's output" in str(exit_info.value)


@pytest.mark.parametrize("layout", ["kept", "bench"])
def test_the_gap_is_read_against_the_runs_own_idle_grace(tmp_path: Path, layout: str):
    """The same 2 ms gap between two requests is no gap for a server whose run set its idle
    grace to 5 ms (its results.json says so, for Case-A or for the whole run), in either
    layout of a run's folder."""
    run = tmp_path / ("r0-gpreempt" if layout == "kept" else "runs/r0/gpreempt")
    _run(run, leak=True)
    server = {"start": [10.000, 10.006], "end": [10.004, 10.020], "scheduled": [10.0, 10.006]}
    (run / "case-a.json").write_text(json.dumps(server))
    params = {"env": {"GPREEMPT_IDLE_GRACE_MS": "5"}} if layout == "kept" else {
        "env": {}, "env_a": {"GPREEMPT_IDLE_GRACE_MS": "5"}}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({"params": params}))
    r = _load().summary(run)
    assert r["idle_grace_ms"] == 5.0
    assert r["steps_past_one_step"] == 2 and r["late_after_a_gap"] == 0
    (tmp_path / "results.json").write_text(json.dumps({"params": {"env": {}}}))
    r = _load().summary(run)
    assert r["idle_grace_ms"] == 0.2 and r["late_after_a_gap"] == 1


def test_a_run_that_does_not_say_its_grace_is_read_against_the_one_given(tmp_path, capsys):
    """A bench older than params.env_a: --grace-ms says the grace its server ran with."""
    _run(tmp_path / "r0-gpreempt", leak=True)
    server = {"start": [10.000, 10.006], "end": [10.004, 10.020], "scheduled": [10.0, 10.006]}
    (tmp_path / "r0-gpreempt" / "case-a.json").write_text(json.dumps(server))
    (tmp_path / "results.json").write_text(json.dumps({"params": {"env": {}}}))
    assert _load().main(["--json", "--grace-ms", "5", str(tmp_path / "r0-gpreempt")]) == 0
    (r,) = json.loads(capsys.readouterr().out).values()
    assert r["idle_grace_ms"] == 5.0 and r["late_after_a_gap"] == 0


def test_around_the_longest_request_lists_what_happened_near_it_in_time_order(tmp_path: Path):
    _run(tmp_path / "run", leak=False)
    r = _load().summary(tmp_path / "run", around_ms=11.5)["around_longest"]
    assert r["request"] == 1 and r["service_ms"] == pytest.approx(12.0)  # 10.008 to 10.020
    times = [t for t, _ in r["timeline"]]
    whats = [w for _, w in r["timeline"]]
    assert times == sorted(times)
    assert (-8.0, "request 0 starts (arrived -8.000, ends 0.000)") in [
        (round(t, 3), w) for t, w in r["timeline"]
    ]
    assert "case-a active" in whats and "case-a idle" not in whats  # 12 ms after: outside
    assert whats.count("trainer step ends") == 3  # 9.997-9.999; 10.0205 on lie outside
