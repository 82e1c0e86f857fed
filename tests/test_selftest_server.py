"""The more important task of ``gpreempt selftest``'s gate rows: registered above the job on its
GPU, so that the daemon gives the job an in-flight share (without one no stream barrier is
put), and gone with its row or with the self-test, however that ends.

With no GPU the gate rows are unproven and start nothing, so the self-test below is run with
its gate row let through on this machine: its job is the CPU job, which no gate holds (the
row then fails after its drain limit), but the server beside it is started and stopped as on
a GPU."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import alive, gp_env, wait_all_gone

from gpreempt.cli._selftest_probe import Workspace, die_with_parent, stop_process
from gpreempt.cli._selftest_server import SERVER_NAME, Server
from gpreempt.cli._task_options import parse_gpus
from gpreempt.cli.selftest import _env, _start_daemon
from gpreempt.client.api import status
from gpreempt.errors import GpreemptError

#: A low task that prints its in-flight share from the daemon each time it changes.
SHARE_WATCHER = r"""
import time
from gpreempt.client import session
control, last = session.current().control, "start"
while True:
    share = control.window_share_ms
    if share != last:
        print(share, flush=True)
        last = share
    time.sleep(0.01)
"""

#: The self-test with its gate row tried on this machine, its drain limit short.
FORCED = r"""
import sys
from gpreempt.cli import _selftest_hold, main, selftest
selftest._why_unproven = lambda mechanism, machine: ""
_selftest_hold.DRAIN_LIMIT_S = 1.0
sys.exit(main(["selftest", "--json", "-m", "gate"]))
"""


def _line(process: subprocess.Popen, timeout: float = 20.0) -> str:
    assert select.select([process.stdout], [], [], timeout)[0], "no line came"
    return process.stdout.readline().strip()


def _tasks(runtime: Path) -> dict[str, dict]:
    try:
        return {t["name"]: t for t in status(runtime_dir=runtime)["tasks"]}
    except GpreemptError:
        return {}


def test_the_server_gives_the_job_a_share_and_goes_when_stopped() -> None:
    workspace = Workspace()
    runtime = workspace.path / "run"
    daemon = _start_daemon(runtime, workspace)
    command = [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", str(runtime)]
    command += ["--priority", "low", "--mechanism", "gate", "--name", "job"]
    job = subprocess.Popen(
        [*command, "--", sys.executable, "-c", SHARE_WATCHER],
        env=_env(runtime, "gate"),
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    server = None
    try:
        assert _line(job) == "None"  # alone on its GPU: no share, no barriers
        server = Server(runtime, workspace, _env(runtime, "server"))
        assert server.error == "" and alive(server.pid)
        listed = _tasks(runtime)[SERVER_NAME]
        assert listed["priority_name"] == "high" and listed["pid"] == server.pid
        assert listed["gpus"] == _tasks(runtime)["job"]["gpus"] == list(parse_gpus(None))
        assert float(_line(job)) > 0  # a share: its gate puts barriers
        pids = (server.process.pid, server.pid)
        server.stop()
        assert _line(job) == "None"  # the share goes with the server
        assert SERVER_NAME not in _tasks(runtime)
        assert not any(alive(pid) for pid in pids)
    finally:
        if server is not None:
            server.stop()
        stop_process(job)
        job.stdout.close()
        stop_process(daemon)
        workspace.close()
        workspace.reaper.kill()
        workspace.reaper.wait()


@pytest.mark.parametrize("how", [None, signal.SIGTERM, signal.SIGKILL])
def test_the_server_is_gone_when_the_selftest_ends(tmp_path, how) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="gpst-", dir="/tmp"))  # short: a socket lies in it
    env = gp_env(tmp_path) | {"TMPDIR": str(scratch)}
    test = subprocess.Popen(
        [sys.executable, "-c", FORCED],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    pids: list[int] = []
    server: dict | None = None
    deadline = time.monotonic() + 30
    # the server registered beside the gate row's job, and recorded for the reaper
    while server is None or server["pid"] not in pids:
        assert time.monotonic() < deadline, "the self-test did not register its server"
        for work in scratch.glob("gpreempt-selftest-*"):
            server = _tasks(work / "run").get(SERVER_NAME) or server
            if (work / "pids").exists():
                pids = [int(x) for x in (work / "pids").read_text().split()]
        time.sleep(0.05)
    assert server["priority_name"] == "high"
    if how is None:
        out, _ = test.communicate(timeout=60)
        rows = {r["mechanism"]: r for r in json.loads(out)["rows"]}
        assert rows["gate"]["verdict"] == "FAILS"  # nothing holds the CPU job
        assert rows["barriers"]["note"] == "the gate failed"
    else:
        os.kill(test.pid, how)
        test.communicate(timeout=30)
    assert len(pids) == 5  # the daemon, the job, the server and their launchers
    wait_all_gone(pids, scratch)
    scratch.rmdir()
