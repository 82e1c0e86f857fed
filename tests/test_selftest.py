"""``gpreempt selftest``: it runs its own job under each mechanism it can try here, calls
"unproven" what it cannot show on this machine, fits 80 columns, is quick on a CPU, and leaves
nothing behind however it is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import gp_env, gpreempt, wait_all_gone

from gpreempt.cli import selftest as selftest_module
from gpreempt.cli._selftest_probe import JOB, Workspace, stop_process
from gpreempt.cli._selftest_rows import WORKS, Machine, Row, report
from gpreempt.cli.selftest import (
    BARRIER_ROWS,
    DRIVER_GATE,
    MECHANISMS,
    _env,
    _job_command,
    _start_daemon,
)
from gpreempt.client.gate.config import SLOW_GATE_NOTICE
from gpreempt.mechanisms.kfd_abi import KFD_DEVICE

NO_GPU = not Path("/dev/nvidiactl").exists() and not Path(KFD_DEVICE).exists()
#: Every row a self-test can show: its mechanisms and their barriers' rows.
ROW_NAMES = [*MECHANISMS, *BARRIER_ROWS.values()]


def selftest(tmp_path: Path, *mechanisms: str) -> tuple[int, dict]:
    args = ["selftest", "--json"]
    for m in mechanisms:
        args += ["--mechanism", m]
    result = gpreempt(tmp_path, *args, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.fixture(scope="module")
def whole_selftest(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, float]:
    """One self-test of every mechanism (its exit code, its report, how long it took)."""
    start = time.monotonic()
    code, report = selftest(tmp_path_factory.mktemp("selftest"))
    return code, report, time.monotonic() - start


def test_signal_is_checked_for_real(tmp_path, request) -> None:
    if NO_GPU:  # the whole self-test tries signal alone here: its run is the one to check
        code, report, _took = request.getfixturevalue("whole_selftest")
        rows = [r for r in report["rows"] if r["mechanism"] == "signal"]
    else:
        code, report = selftest(tmp_path, "signal")
        rows = report["rows"]
    (row,) = rows
    assert row["verdict"] == "works" and row["stopped"] and row["resumed"] and row["works"]
    assert row["suspend_ms"] > 0
    # judged once its launches drained: none go on after SIGSTOP, so the progress stood still
    # from the first read after the suspend call returned (its drain is read every 5 ms). How
    # many steps ran during the call depends on how fast the job steps on this machine.
    assert 0 <= row["drain_ms"] <= row["suspend_ms"] + 10
    assert code == 0


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_without_a_gpu_nothing_but_signal_is_claimed(whole_selftest) -> None:
    code, report, took = whole_selftest
    assert took < 10
    verdicts = {r["mechanism"]: r["verdict"] for r in report["rows"]}
    assert verdicts == {
        "gate": "unproven",
        "lock": "unproven",
        "signal": "works",
        "kfd": "unproven",
        "driver-gate": "unproven",
    }
    kfd = next(r for r in report["rows"] if r["mechanism"] == "kfd")
    assert "/dev/kfd" in kfd["note"]
    assert code == 0  # unproven is not a failure


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_the_driver_gate_is_unproven_without_an_nvidia_gpu(tmp_path) -> None:
    _code, report = selftest(tmp_path, DRIVER_GATE)
    (row,) = report["rows"]
    assert row["verdict"] == "unproven" and "NVIDIA" in row["note"]


def test_the_driver_gate_job_runs_without_the_operator_hook(tmp_path, monkeypatch) -> None:
    # only the driver-level gate may hold it, so that its row proves the driver-level gate
    monkeypatch.delenv("GPREEMPT_GATE", raising=False)
    assert _env(tmp_path, DRIVER_GATE)["GPREEMPT_GATE"] == "0"
    assert "GPREEMPT_GATE" not in _env(tmp_path, "gate")  # the gate's own row keeps its hook


#: Prints whether the in-process client was loaded into it (by ``gpreempt run``'s site hook).
CLIENT_PROBE = "import sys; print('gpreempt.client.agent' in sys.modules)"


@pytest.mark.parametrize(("mechanism", "client"), [(DRIVER_GATE, "False"), ("gate", "True")])
def test_the_driver_gate_job_runs_without_the_in_process_client(mechanism, client) -> None:
    # without it, the driver-level gate opens its own channel and alone can hold the job
    workspace = Workspace()
    runtime = workspace.path / "run"
    daemon = _start_daemon(runtime, workspace)
    try:
        env = _env(runtime, mechanism)
        command = _job_command(runtime, mechanism, "probe", env, [])
        assert command[-2:] == ["-c", JOB]
        command[-1] = CLIENT_PROBE
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
        assert result.stdout.strip() == client, result.stderr
    finally:
        stop_process(daemon)
        workspace.close()
        workspace.reaper.kill()
        workspace.reaper.wait()


def test_a_gate_job_that_does_not_start_fails_with_its_barriers_row(monkeypatch) -> None:
    monkeypatch.setattr(selftest_module, "JOB", "raise SystemExit('no GPU here')")
    workspace = Workspace()
    runtime = workspace.path / "run"
    daemon = _start_daemon(runtime, workspace)
    try:
        row = Row("gate")
        barriers = selftest_module._exercise(row, runtime, workspace, "python")
    finally:
        stop_process(daemon)
        workspace.close()
        workspace.reaper.kill()
        workspace.reaper.wait()
    assert row.verdict == "FAILS" and row.note.startswith("the job did not start")
    assert barriers is not None and barriers.mechanism == "barriers"
    assert barriers.verdict == "unproven" and barriers.note == "the gate failed"


def test_a_gate_without_its_cpp_part_says_so_in_its_barriers_row(tmp_path) -> None:
    # the Python gate puts no stream barriers: the row says why there were none, not "off?"
    log = tmp_path / "job.log"
    line = f"{SLOW_GATE_NOTICE} (no C++ compiler ('c++' is not on PATH))"
    log.write_text(f"starting\n{line}\nstep 1\n")
    assert selftest_module._slow_gate(log) == line
    log.write_text("starting\nstep 1\n")
    assert selftest_module._slow_gate(log) == ""


def test_table_fits_80_columns(tmp_path) -> None:
    env = gp_env(tmp_path) | {"COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "gpreempt", "selftest", "-m", "kfd", "-m", "driver-gate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "gpreempt selftest" in result.stdout and "kfd" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_every_row_fits_80_columns_with_its_drain(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    note = "the job kept making progress while suspended; " * 2
    rows = [Row(m, WORKS, True, True, 3, None, 2.0, 9.4, 1, note) for m in ROW_NAMES]
    rows[2].drain_ms = 1583.0
    report(rows, Machine("nvidia", True), as_json=False)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "drain" in out and "9 ms" in out and "1.58 s" in out
    assert all(name in out for name in ROW_NAMES)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_selftest_leaves_nothing_behind(tmp_path, how) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="gpst-", dir="/tmp"))  # short: a socket lies in it
    env = gp_env(tmp_path) | {"TMPDIR": str(scratch)}
    test = subprocess.Popen(
        [sys.executable, "-m", "gpreempt", "selftest", "-m", "signal"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    deadline = time.monotonic() + 30
    while len(pids) < 3:  # the daemon, the launcher, the job
        assert time.monotonic() < deadline, "the self-test did not start its job"
        for listed in scratch.glob("gpreempt-selftest-*/pids"):
            pids = [int(x) for x in listed.read_text().split()]
        time.sleep(0.05)
    os.kill(test.pid, how)
    test.wait(30)
    wait_all_gone(pids, scratch)
    scratch.rmdir()
