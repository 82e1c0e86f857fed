"""benchmarks/driver_gate/request_cpu_cost.py: what request() costs a server's CPU under a real
daemon, with no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCRIPT = ROOT / "benchmarks/driver_gate/request_cpu_cost.py"


def test_it_times_every_mode_and_pattern_under_a_daemon(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "1", "--requests", "16", "--work-ms", "0.2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert {(r["mode"], r["pattern"]) for r in rows} == {
        (m, p) for m in ("noreq", "req", "pyreq", "linger0") for p in ("idle", "queued")
    }
    assert not any(r["native"] for r in rows if r["mode"] == "pyreq")
    assert all(r["enter_us"] > 0 and r["exit_us"] > 0 and r["work_us"] > 50 for r in rows)
    assert "linger0" in done.stdout and "enter us" in done.stdout


def test_bad_counts_are_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--rounds must be 1 or more" in done.stderr
