"""``gpreempt selftest`` on a CPU machine: it runs its own job under each mechanism that
exists here, and reports what does not exist without failing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import gpreempt

from gpreempt.mechanisms.kfd_abi import KFD_DEVICE


def selftest(tmp_path: Path, *mechanisms: str) -> tuple[int, dict]:
    args = ["selftest", "--json"]
    for m in mechanisms:
        args += ["--mechanism", m]
    result = gpreempt(tmp_path, *args, timeout=300)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def test_signal_is_checked_for_real(tmp_path) -> None:
    code, report = selftest(tmp_path, "signal")
    (row,) = report["rows"]
    assert row["exists"] and row["stopped"] and row["resumed"] and row["works"]
    assert row["suspend_ms"] > 0
    assert code == 0


def test_gate_on_cpu_tensors(tmp_path) -> None:
    pytest.importorskip("torch")
    code, report = selftest(tmp_path, "gate")
    (row,) = report["rows"]
    assert row["works"], row
    assert code == 0


def test_missing_mechanisms_are_reported_not_failed(tmp_path) -> None:
    if Path(KFD_DEVICE).exists():
        pytest.skip("this machine has a KFD device")
    code, report = selftest(tmp_path, "kfd")
    (row,) = report["rows"]
    assert not row["exists"] and "/dev/kfd" in row["note"]
    assert code == 0


def test_table_by_default(tmp_path) -> None:
    result = gpreempt(tmp_path, "selftest", "--mechanism", "kfd", timeout=120)
    assert "gpreempt selftest" in result.stdout and "kfd" in result.stdout
