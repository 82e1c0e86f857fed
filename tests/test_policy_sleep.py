"""policy/sleep.py: which gates may turn their operator hook off, and when the next one may."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import Daemon, gp_env, spawn, wait_for
from conftest import task_view as view

from gpreempt.policy import Snapshot
from gpreempt.policy.sleep import sleepers


def trainer(task_id: int = 1, **fields):
    return view(task_id, -100, gated=True, active=True, **fields)


def server(task_id: int = 2, idle_s: float = math.inf, **fields):
    return view(task_id, 100, active=idle_s == 0, idle_s=idle_s, **fields)


def test_a_lone_trainer_sleeps() -> None:
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(),))) == ({1}, None)


def test_a_server_that_never_ran_lets_it_sleep_at_once() -> None:
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(), server()))) == ({1}, None)


def test_an_active_or_recently_active_server_keeps_it_awake() -> None:
    assert sleepers(Snapshot(now=10.0, tasks=(trainer(), server(idle_s=0)))) == (set(), None)
    allowed, due = sleepers(Snapshot(now=10.0, tasks=(trainer(), server(idle_s=0.5))), 2.0)
    assert allowed == set()
    assert due == 11.5  # once the server has been idle 2 s
    allowed, due = sleepers(Snapshot(now=10.0, tasks=(trainer(), server(idle_s=2.0))), 2.0)
    assert (allowed, due) == ({1}, None)


def test_by_default_a_second_of_idleness_lets_it_sleep() -> None:
    """An asleep gate still puts barriers, so the pause only outlasts the gaps of traffic."""
    allowed, due = sleepers(Snapshot(now=10.0, tasks=(trainer(), server(idle_s=0.25))))
    assert allowed == set()
    assert due == 10.75
    assert sleepers(Snapshot(now=10.0, tasks=(trainer(), server(idle_s=1.0))))[0] == {1}


def test_someone_who_needs_its_activity_keeps_it_awake() -> None:
    below = view(3, -200, active=True)
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(), below)))[0] == set()
    peer = trainer(4)  # peers in turns pass the turn on when the holder goes idle
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(), peer)))[0] == set()
    ungated_peer = view(5, -100, active=True)
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(), ungated_peer)))[0] == {1}


def test_a_server_that_calls_request_may_sleep_above_its_trainers() -> None:
    gated_server = server(gated=True, idle_s=0)
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(), gated_server)))[0] == set()
    hinted = server(gated=True, idle_s=0, hinted=True)  # its requests say when it is active
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(), hinted)))[0] == {2}


def test_other_gpus_do_not_count_and_multi_gpu_tasks_need_every_gpu_quiet() -> None:
    elsewhere = server(idle_s=0, gpus=(1,))
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(), elsewhere)))[0] == {1}
    spanning = trainer(gpus=(0, 1))
    assert sleepers(Snapshot(now=0.0, tasks=(spanning, elsewhere)))[0] == set()


def test_ungated_suspended_or_held_tasks_and_a_zero_delay_never_sleep() -> None:
    assert sleepers(Snapshot(now=0.0, tasks=(view(1, -100),)))[0] == set()
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(suspended=True),)))[0] == set()
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(held=True),)))[0] == set()
    assert sleepers(Snapshot(now=0.0, tasks=(trainer(),)), after_s=0) == (set(), None)


SERVER = """
import os, sys, time
import gpreempt
session = gpreempt.attach("high", name="srv", gate=False, runtime_dir=sys.argv[1])
session.control.set_barriers_on(True)  # stands for its installed gate
go = sys.argv[2] + ".go"
while True:
    if os.path.exists(go):
        session.enter_request()
        session.exit_request()
        os.remove(go)
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(int(session.control.sleep_ok)))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(0.02)
"""


def test_the_daemon_lets_a_server_sleep_above_a_trainer_once_it_uses_request(
    runtime_dir: Path, tmp_path: Path
) -> None:
    daemon = Daemon(runtime_dir)
    seen = tmp_path / "sleep_ok"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(runtime_dir), str(seen)], env=gp_env(runtime_dir)
    )
    procs = [server]

    def sleep_ok() -> str:
        return seen.read_text() if seen.exists() else ""

    try:
        assert wait_for(lambda: sleep_ok() == "1", 10), sleep_ok()  # alone: nobody needs it
        procs.append(spawn(runtime_dir, "run", "-p", "low", "--name", "b", "--", "sleep", "60"))
        assert wait_for(lambda: sleep_ok() == "0", 10), sleep_ok()  # its launches are needed
        time.sleep(0.3)
        assert sleep_ok() == "0"
        Path(f"{seen}.go").touch()  # its first request: from now on its requests say it
        assert wait_for(lambda: sleep_ok() == "1", 10), sleep_ok()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(10)
        daemon.stop()
