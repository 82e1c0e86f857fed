"""The in-flight budget: split per GPU among the tasks a more important one could preempt."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Daemon, gp_env, spawn, wait_for
from conftest import task_view as view

from gpreempt.control_block import ControlBlock
from gpreempt.policy import Snapshot
from gpreempt.policy.inflight import DEFAULT_BUDGET_MS, inflight_shares


def shares(*tasks, budget: float = 1.0) -> dict[int, float]:
    return inflight_shares(Snapshot(now=0.0, tasks=tasks), budget)


def test_lower_tasks_split_the_budget_whether_or_not_anyone_is_active() -> None:
    # registered is enough: the bound must already hold when the high task's request arrives
    tasks = (view(1, 100, active=False), view(2, -100), view(3, -100), view(4, 0))
    assert shares(*tasks, budget=0.9) == pytest.approx({2: 0.3, 3: 0.3, 4: 0.3})


def test_no_limit_without_a_more_important_task() -> None:
    assert shares(view(1, 0), view(2, 0)) == {}
    assert shares(view(1, -100)) == {}


def test_held_tasks_take_no_share() -> None:
    assert shares(view(1, 100), view(2, -100), view(3, -100, held=True)) == {2: 1.0}


def test_gpus_split_separately_and_a_task_on_two_takes_the_smaller_share() -> None:
    tasks = (
        view(1, 100, gpus=(0, 1)),
        view(2, -100, gpus=(0,)),
        view(3, -100, gpus=(0, 1)),
        view(4, -100, gpus=(0,)),
        view(5, -100, gpus=(2,)),  # nobody more important on GPU 2
    )
    assert shares(*tasks, budget=1.2) == pytest.approx({2: 0.4, 3: 0.4, 4: 0.4})


def test_zero_budget_means_no_limit() -> None:
    assert shares(view(1, 100), view(2, -100), budget=0.0) == {}


def test_control_block_carries_the_share() -> None:
    block = ControlBlock.create()
    try:
        assert block.window_share_ms is None
        block.set_window_share(0.25)
        assert block.window_share_ms == 0.25
        block.set_window_share(0.0001)  # never rounds down to "no limit"
        assert block.window_share_ms == 0.001
        block.set_window_share(None)
        assert block.window_share_ms is None
    finally:
        block.close()


WATCHER = """
import os, sys, time
import gpreempt
session = gpreempt.attach("low", name="watched", gate=False, runtime_dir=sys.argv[1])
while True:
    share = session.control.window_share_ms
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write("none" if share is None else repr(share))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(0.02)
"""


def test_daemon_writes_shares_as_tasks_come_and_go(runtime_dir: Path, tmp_path: Path) -> None:
    daemon = Daemon(runtime_dir)
    seen = tmp_path / "share"
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(runtime_dir), str(seen)], env=gp_env(runtime_dir)
    )
    others: list[subprocess.Popen] = []

    def share() -> str:
        return seen.read_text() if seen.exists() else ""

    try:
        assert wait_for(lambda: share() == "none", 10), share()
        others.append(spawn(runtime_dir, "run", "-p", "high", "--name", "srv", "--", "sleep", "60"))
        assert wait_for(lambda: share() == repr(DEFAULT_BUDGET_MS), 10), share()
        others.append(spawn(runtime_dir, "run", "-p", "low", "--name", "b2", "--", "sleep", "60"))
        assert wait_for(lambda: share() == repr(DEFAULT_BUDGET_MS / 2), 10), share()
        others[0].send_signal(signal.SIGTERM)
        others[0].wait(10)
        assert wait_for(lambda: share() == "none", 10), share()
    finally:
        for proc in [watcher, *others]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(10)
        daemon.stop()


@pytest.mark.parametrize("flag", ["--inflight-budget-ms", "--backstop-ms", "--turn-ms"])
@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_serve_refuses_bad_durations(runtime_dir: Path, flag: str, value: str) -> None:
    proc = spawn(runtime_dir, "serve", "--runtime-dir", str(runtime_dir), flag, value)
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert f"{flag} must be a finite number of ms, 0 or more" in err
