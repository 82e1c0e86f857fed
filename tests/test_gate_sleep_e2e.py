"""With a real daemon: a gated trainer's gate sleeps while nobody more important was active
lately, and a request still stops it at once (CPU tensors, native gate)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import (
    HOLDING_SERVER,
    TORCH_COUNTER,
    Counter,
    Daemon,
    spawn,
    status,
    stop_all,
    wait_for,
)

pytest.importorskip("torch")


def test_a_sleeping_gate_still_stops_for_a_request(runtime_dir: Path, tmp_path: Path) -> None:
    from gpreempt.client.gate.build import NativeGateUnavailable, load_native

    try:
        load_native()
    except NativeGateUnavailable as exc:
        pytest.skip(f"native gate unavailable: {exc}")
    daemon = Daemon(runtime_dir, "--sleep-after-s", "0.3")
    script = tmp_path / "torch_counter.py"
    script.write_text(TORCH_COUNTER)
    progress, go, inside = tmp_path / "progress", tmp_path / "go", tmp_path / "inside"
    release = tmp_path / "release"
    server_script = tmp_path / "server.py"
    server_script.write_text(HOLDING_SERVER)
    low = ("run", "-p", "low", "--name", "trainer", "--", sys.executable, str(script))
    trainer = spawn(runtime_dir, *low, str(progress))
    high = ("run", "-p", "high", "--name", "srv", "--", sys.executable, str(server_script))
    server = spawn(runtime_dir, *high, str(runtime_dir), str(go), str(inside), "30", str(release))
    counter = Counter(progress)

    def gate() -> dict:
        task = next(t for t in status(runtime_dir)["tasks"] if t["name"] == "trainer")
        return task.get("gate") or {}

    def launches() -> int:
        return gate().get("launches", 0)

    try:
        assert wait_for(lambda: counter.value() > 0 and launches() > 0, 120)

        # the server never ran: the gate sleeps, operators run unseen
        def asleep() -> bool:
            before, progressed = launches(), counter.value()
            time.sleep(0.3)
            return launches() == before and counter.value() > progressed

        assert wait_for(asleep, 20, interval=0.1), "the trainer's gate never slept"
        assert gate()["sleep_ok"]  # status says so
        go.touch()
        assert wait_for(inside.exists, 20)
        assert wait_for(lambda: not gate()["sleep_ok"], 5)
        time.sleep(0.2)
        assert counter.progress_over(0.5) == 0, "a sleeping gate let the trainer run on"
        release.touch()
        assert wait_for(lambda: not inside.exists(), 10)
        assert counter.advances(10)
        assert wait_for(asleep, 20, interval=0.1), "the gate did not sleep again"
    finally:
        stop_all(trainer, server)
        daemon.stop()
