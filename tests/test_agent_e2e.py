"""`gpreempt run` gives a PyTorch child the launch gate without code changes (CPU tensors)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import TORCH_COUNTER, Counter, Daemon, gpreempt, spawn, status, wait_for

pytest.importorskip("torch")


def test_gate_is_installed_and_used_by_auto(
    daemon: Daemon, runtime_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "torch_counter.py"
    script.write_text(TORCH_COUNTER)
    progress = tmp_path / "progress"
    low = spawn(
        runtime_dir,
        "run",
        "--priority",
        "low",
        "--name",
        "trainer",
        "--",
        sys.executable,
        str(script),
        str(progress),
    )
    try:
        counter = Counter(progress)
        assert wait_for(lambda: counter.value() > 0, 120), "the PyTorch child never ran"

        def trainer() -> dict:
            return next(t for t in status(runtime_dir)["tasks"] if t["name"] == "trainer")

        assert wait_for(lambda: (trainer()["gate"] or {}).get("installed"), 30)
        assert gpreempt(runtime_dir, "suspend", "trainer").returncode == 0
        task = trainer()
        assert task["state"] == "held" and task["last_mechanism"] == "gate"
        time.sleep(0.2)
        assert counter.progress_over(0.5) == 0, "the gate let operators through"
        assert gpreempt(runtime_dir, "resume", "trainer").returncode == 0
        assert counter.advances(5)
        assert trainer()["gate"]["waits"] >= 1
    finally:
        low.send_signal(signal.SIGTERM)
        low.wait(30)
