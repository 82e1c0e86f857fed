"""``gpreempt selftest`` on a GPU: each mechanism judged from what the GPU executed (its own
kernels count in a page the self-test reads) once what the job had queued drained, with work
pending where the GPU holds it; the gates' stream barriers, with a more important task
registered beside the job, hold queued steps and stop the GPU at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

NVIDIA = Path("/dev/nvidiactl").exists()
AMD = Path("/dev/kfd").exists()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU that PyTorch sees"),
]

SRC = Path(__file__).resolve().parents[2] / "src"
#: Steps the job may complete after the suspension for its barriers to hold (_selftest_hold).
BARRIER_MAX_STEPS = 2


def selftest(*mechanisms: str) -> dict:
    args = [sys.executable, "-m", "gpreempt", "selftest", "--json"]
    for m in mechanisms:
        args += ["-m", m]
    # the caller's environment (PATH finds the compiler that builds the gates) without any
    # setting of gpreempt's own
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPREEMPT_")}
    env["PYTHONPATH"] = str(SRC)
    result = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return {r["mechanism"]: r for r in json.loads(result.stdout)["rows"]}


def _barriers_held(row: dict) -> None:
    assert row["verdict"] == "works", f"{row['verdict']}: {row.get('note')} ({row})"
    assert row["pending"] > 0 and row["drained"] <= BARRIER_MAX_STEPS, row
    assert row["drain_ms"] < 100, row  # a step or two of 10 ms, not the queue


def test_the_gate_holds_gpu_work_and_its_barriers_hold_a_queued_kernel() -> None:
    rows = selftest("gate")
    assert rows["gate"]["verdict"] == "works", rows["gate"]
    _barriers_held(rows["barriers"])


def test_signal_stops_the_process_and_says_the_gpu_ran_on() -> None:
    row = selftest("signal")["signal"]
    assert row["verdict"] == "works", f"{row['verdict']}: {row.get('note')} ({row})"


@pytest.mark.skipif(not NVIDIA, reason="the driver lock is NVIDIA's")
def test_the_driver_lock_is_judged_from_the_gpu() -> None:
    row = selftest("lock")["lock"]
    assert row["verdict"] in ("works", "unproven"), row  # unproven: a driver before r570
    if row["verdict"] == "unproven":
        assert "r570" in row["note"]
    else:
        assert row["drain_ms"] is not None, row  # judged once what it had queued ran


@pytest.mark.skipif(not AMD, reason="kfd is AMD's")
def test_kfd_holds_the_queues_with_work_pending() -> None:
    row = selftest("kfd")["kfd"]
    assert row["verdict"] == "works", f"{row['verdict']}: {row.get('note')} ({row})"
    assert row["queues"] > 0 and row["pending"] > 0


@pytest.mark.skipif(not NVIDIA, reason="the driver-level gate is CUDA's")
def test_the_driver_level_gate_alone_holds_the_gpu_job() -> None:
    # PyTorch's operator hook off: only the driver-level gate can have held the job
    rows = selftest("driver-gate")
    assert rows["driver-gate"]["verdict"] == "works", rows["driver-gate"]
    _barriers_held(rows["driver-barriers"])
