"""The fault loop: whatever is killed, and whenever, no task is left stopped.

Each round starts a daemon, a task registered with ``attach`` (no launcher), one started by
``gpreempt run`` and a high-priority client whose requests stop both, then injects one
fault the moment a suspension was made (the attached task is seen stopped): a daemon
SIGKILL or SIGTERM, a launcher SIGKILL, a SIGKILL of the high client inside ``request()``,
or a daemon SIGKILL with a new daemon started at once. Once a daemon serves again and the
high client is gone, every process must run.

``GPREEMPT_FAULT_ROUNDS`` sets the number of rounds (a few by default; the release check runs
250: ``GPREEMPT_FAULT_ROUNDS=250 PYTHONPATH=src python3 -m pytest -q tests/test_fault_loop.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Daemon, gp_env, gpreempt, process_state, spawn, wait_for

from gpreempt.client.connection import DaemonClient
from gpreempt.errors import GpreemptError

FAULTS = ("daemon-kill", "daemon-term", "launcher-kill", "high-kill-in-request", "kill-restart")

#: A high client that enters a request every few milliseconds; the file exists inside one.
HIGH = """
import sys, time, pathlib
import gpreempt
gpreempt.attach("high", name="high", gate=False, runtime_dir=sys.argv[1])
inside = pathlib.Path(sys.argv[2])
while True:
    with gpreempt.request():
        inside.touch()
        time.sleep(0.02)
        inside.unlink()
    time.sleep(0.02)
"""


def rounds() -> int:
    raw = os.environ.get("GPREEMPT_FAULT_ROUNDS", "").strip()
    return int(raw) if raw else len(FAULTS)


def stopped_soon(pid: int) -> bool:
    """Wait (tightly: the fault must follow the suspension within a millisecond) until
    ``pid`` is stopped; False if that does not happen within 3 s."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if process_state(pid) == "T":
            return True
    return False


def low_processes(runtime_dir: Path) -> list[int]:
    with DaemonClient.connect(runtime_dir, timeout=5) as client:
        return [t["pid"] for t in client.status()["tasks"] if t["priority"] < 0]


def one_round(runtime_dir: Path, tmp: Path, fault: str) -> list[int]:
    """Run one round; returns the pids left stopped."""
    daemon = Daemon(runtime_dir)
    procs: list[subprocess.Popen] = []
    inside = tmp / "inside"
    try:
        attached = subprocess.Popen(["sleep", "600"])
        procs.append(attached)
        result = gpreempt(runtime_dir, "attach", "--pid", str(attached.pid), "--priority", "low")
        assert result.returncode == 0, result.stderr
        launcher = spawn(runtime_dir, "run", "--priority", "low", "--", "sleep", "600")
        procs.append(launcher)
        assert wait_for(lambda: len(low_processes(runtime_dir)) == 2, 10)
        child = next(p for p in low_processes(runtime_dir) if p != attached.pid)
        high = subprocess.Popen(
            [sys.executable, "-c", HIGH, str(runtime_dir), str(inside)], env=gp_env(runtime_dir)
        )
        procs.append(high)
        assert stopped_soon(attached.pid), "the high client's request stopped nothing"
        if fault in ("daemon-kill", "kill-restart"):
            daemon.process.kill()
        elif fault == "daemon-term":
            daemon.process.terminate()
        elif fault == "launcher-kill":
            launcher.kill()
        else:
            assert wait_for(inside.exists, 3, interval=0.001)
            high.kill()
        daemon.process.wait(10) if fault.startswith(("daemon", "kill")) else None
        if fault == "kill-restart":
            daemon = Daemon(runtime_dir)  # while the old one's clients still go away
        high.kill()
        high.wait()
        if daemon.process.poll() is not None:
            daemon = Daemon(runtime_dir)
        pids = [attached.pid, child]
        wait_for(lambda: all(process_state(p) != "T" for p in pids), 3)
        left = [p for p in pids if process_state(p) == "T"]
        for pid in left:  # for the next rounds' sake
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        return left
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        daemon.stop()
        with contextlib.suppress(FileNotFoundError):
            inside.unlink()


@pytest.mark.timeout(0)
def test_no_fault_leaves_a_task_stopped(runtime_dir: Path, tmp_path: Path) -> None:
    left: dict[str, int] = {}
    total = rounds()
    for n in range(total):
        fault = FAULTS[n % len(FAULTS)]
        try:
            stopped = one_round(runtime_dir, tmp_path, fault)
        except GpreemptError as exc:
            pytest.fail(f"round {n} ({fault}): {exc}")
        if stopped:
            left[fault] = left.get(fault, 0) + len(stopped)
    print(f"{total} rounds, left stopped: {sum(left.values())} {left}")
    assert not left, f"tasks left stopped after {total} rounds, by fault: {left}"
