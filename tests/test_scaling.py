"""What the daemon's work costs does not grow with processes it does not manage.

A root daemon stops another user's task with that user's authority (daemon/identity.py), not
after reading every process of the node: stopping 300 such tasks at once takes about as long
with 2,000 unrelated processes on the node as without (docs/robustness.md).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Daemon, process_state, wait_for
from hostile import NOBODY, needs_root, sleepers

from gpreempt.client.connection import DaemonClient

TASKS = 300
UNRELATED = 2000


def as_nobody() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def stop_all_ms(runtime_dir: Path, lows: list[int], high: int, rounds: int = 5) -> float:
    """Median time for a high task's registration to stop every low one (the reply comes
    after the scheduling pass that stopped them)."""
    times = []
    with DaemonClient.connect(runtime_dir, timeout=60) as client:
        for _ in range(rounds):
            start = time.perf_counter()
            client.register(high, priority="high", always_active=True, name="high")
            times.append((time.perf_counter() - start) * 1e3)
            assert all(process_state(pid) == "T" for pid in lows)
            client.detach(high)
            assert wait_for(lambda: all(process_state(pid) != "T" for pid in lows), 10)
    return statistics.median(times)


@pytest.mark.slow
@needs_root
@pytest.mark.timeout(600)
def test_stop_all_latency_does_not_grow_with_unrelated_processes(runtime_dir: Path) -> None:
    daemon = Daemon(runtime_dir)
    try:
        with (
            sleepers(TASKS, preexec_fn=as_nobody, start_new_session=True) as lows,
            sleepers(1) as (high,),
        ):
            with DaemonClient.connect(runtime_dir, timeout=60) as client:
                for proc in lows:
                    client.register(proc.pid, priority="low", mechanism="signal")
            pids = [proc.pid for proc in lows]
            without = stop_all_ms(runtime_dir, pids, high.pid)
            with sleepers(UNRELATED, stdin=subprocess.DEVNULL):
                crowded = stop_all_ms(runtime_dir, pids, high.pid)
        print(f"stop-all of {TASKS} tasks: {without:.1f} ms, {crowded:.1f} ms with {UNRELATED}")
        assert crowded <= 2 * without, (without, crowded)
    finally:
        daemon.stop()
