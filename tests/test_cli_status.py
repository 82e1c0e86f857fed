"""`gpreempt status`'s table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import Daemon, gpreempt, status

DAEMON = {"pid": 1, "policy": "hpf", "runtime_dir": "/tmp/x", "lock_available": True}


def _task(**fields: Any) -> dict[str, Any]:
    """A task as `status --json` gives it: a low-priority trainer on GPU 0, unless told."""
    return {
        "pid": 5,
        "name": "trainer",
        "priority": -100,
        "priority_name": "low",
        "gpus": [0],
        "mechanism": "auto",
        "state": "running",
        "active": True,
        "preemptions": 0,
        "suspended_seconds": 0.0,
        "last_suspend_ms": None,
        "last_mechanism": None,
        **fields,
    }


def test_status_table_shows_evicted_memory(capsys, monkeypatch) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", "200")
    task = _task(
        state="evicted",
        active=False,
        preemptions=3,
        suspended_seconds=1.5,
        last_suspend_ms=0.02,
        last_mechanism="lock",
        evicted_bytes=32 * 2**30,
    )
    print_status({"daemon": DAEMON, "tasks": [task]})
    out = capsys.readouterr().out
    assert "on host GiB" in out and "32.00" in out and "evicted" in out


def test_status_shows_a_multi_gpu_job_under_each_of_its_gpus_as_one_task(
    capsys, monkeypatch
) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", "200")
    job = _task(
        pid=7,
        name="ddp",
        gpus=[0, 1],
        processes=3,  # torchrun and its two ranks
        state="suspended",
        preemptions=1,
        suspended_seconds=0.4,
        last_suspend_ms=0.01,
        last_mechanism="gate",
    )
    server = _task(pid=9, name="srv", priority=100, priority_name="high", gpus=[1], processes=1)
    print_status({"daemon": DAEMON, "tasks": [job, server]})
    out = capsys.readouterr().out
    assert out.count("ddp (GPUs 0,1; 3 processes)") == 2  # under GPU 0 and under GPU 1
    assert "GPU 0" in out and "GPU 1" in out
    assert "srv (" not in out  # one process on one GPU: nothing to add


def test_a_task_whose_suspension_did_not_hold_gets_a_line_saying_so(capsys, monkeypatch) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", "200")
    held = _task(name="ok", gate={"trusted": True, "hold_leaks": 0, "barrier_leaks": 0})
    leaking = _task(pid=6, name="jax", gate={"trusted": False, "hold_leaks": 1, "barrier_leaks": 3})
    print_status({"daemon": DAEMON, "tasks": [held, leaking]})
    out = capsys.readouterr().out
    assert "not held: jax (pid 6)" in out and "3 time(s)" in out
    assert "not held: ok" not in out


def test_status_json_prints_the_daemons_reply(daemon: Daemon, runtime_dir: Path) -> None:
    """What the end-to-end tests read in this process (conftest.status) is what
    `gpreempt status --json` prints: the daemon's reply without its "ok"."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        attached = gpreempt(runtime_dir, "attach", "--pid", str(sleeper.pid), "--name", "sleeper")
        assert attached.returncode == 0, attached.stderr
        result = gpreempt(runtime_dir, "status", "--json")
        assert result.returncode == 0, result.stderr
        printed, asked = json.loads(result.stdout), status(runtime_dir)
        assert "ok" not in printed and set(printed) == set(asked)
        assert printed["daemon"]["pid"] == asked["daemon"]["pid"] == daemon.process.pid
        assert [t["name"] for t in printed["tasks"]] == [t["name"] for t in asked["tasks"]]
        assert [t["name"] for t in asked["tasks"]] == ["sleeper"]
        assert set(printed["tasks"][0]) == set(asked["tasks"][0])
    finally:
        sleeper.kill()
        sleeper.wait()
