"""benchmarks/driver_gate/cold_start.py: the medians per mode and their distance to ``idle``
(the requests themselves need a GPU)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, check_says_no_gpu, load_script


def test_each_mode_is_read_against_the_idle_requests() -> None:
    rows = {
        "idle": [(1.2, 1.3), (1.19, 1.28), (1.25, 1.9)],
        "other-spin": [(1.33, 1.41), (1.35, 1.44), (1.32, 1.40)],
    }
    out = load_script("benchmarks/driver_gate/cold_start.py").summarise(rows)
    assert out["idle"] == {"n": 3, "span_p50": 1.2, "service_p50": 1.3, "span_over_idle": 0.0,
                           "service_over_idle": 0.0}  # fmt: skip
    assert out["other-spin"]["span_over_idle"] == pytest.approx(0.13)
    assert out["other-spin"]["service_over_idle"] == pytest.approx(0.11)


def test_without_idle_requests_no_distance_is_made_up() -> None:
    out = load_script("benchmarks/driver_gate/cold_start.py").summarise({"own-flush": [(1.0, 1.1)]})
    assert "span_over_idle" not in out["own-flush"]


def test_without_a_gpu_it_says_so_in_one_line(capsys) -> None:
    torch = pytest.importorskip("torch")
    check_says_no_gpu(capsys, torch, "benchmarks/driver_gate/cold_start.py", "--rounds", "1")


def test_without_mps_tools_it_says_to_run_without_mps(capsys) -> None:
    if shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("the MPS tools are here")
    assert load_script("benchmarks/driver_gate/cold_start.py").main(["--mps"]) == 2
    assert capsys.readouterr().err.endswith("run it without --mps\n")


def test_under_mps_the_daemon_is_told_to_quit_after_the_server_is_gone(tmp_path) -> None:
    """A stand-in for the MPS control binary logs how it is called; the server's process,
    without a GPU here, ends with its one line before the daemon is told to quit."""
    pytest.importorskip("torch")
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "${{1:-$(cat)}}" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT / "src")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/driver_gate/cold_start.py"), "--mps"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "cold_start: no CUDA GPU here"
    assert log.read_text().split() == ["-d", "quit"]


def test_a_driver_call_that_fails_stops_the_measure_with_its_error() -> None:
    """cuda-bindings answers (error, value...) or a bare error: the value where the error is 0,
    one line naming the error otherwise."""
    checked = load_script("benchmarks/driver_gate/cold_start.py")._checked
    assert checked((0, 4096)) == 4096
    assert checked((0,)) is None and checked(0) is None
    with pytest.raises(SystemExit, match=r"a CUDA driver call failed \(1\)"):
        checked((1, 0))


def test_an_other_process_that_ends_is_said_in_one_line() -> None:
    import multiprocessing as mp

    script = load_script("benchmarks/driver_gate/cold_start.py")
    mine, theirs = mp.Pipe()
    child = mp.get_context("spawn").Process(target=int)  # ends at once, answers nothing
    child.start()
    child.join()
    with pytest.raises(SystemExit, match="the other process ended"):
        script._answer(mine, child)
    theirs.send("done")
    assert script._answer(mine, child) == "done"
