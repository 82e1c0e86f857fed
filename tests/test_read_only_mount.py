"""A workload reaches the node's daemon through a read-only mount of its runtime directory
(deploy/kubernetes/example-*.yaml): a client only connects to the socket, and creates nothing
there. The mount is made read-only in a private mount namespace (root and unshare(1) needed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Daemon, gp_env, status, wait_for


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _can_unshare(), reason="needs root and unshare(1) to mount the directory read-only"
)

#: Under ``gpreempt run``: one request (which opens the channel: control block and doorbell
#: over the socket), after checking that nothing can be created in the runtime directory; it
#: lasts until the file argv[1] exists (60 s at most).
CLIENT = """
import os, sys, time
import gpreempt
try:
    open(os.path.join(os.environ["GPREEMPT_RUNTIME_DIR"], "planted"), "w")
    sys.exit("the runtime directory is writable")
except OSError:
    pass
def until(path, end=time.monotonic() + 60):
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.01)
with gpreempt.request():
    until(sys.argv[1])
"""


def _run_read_only(runtime_dir: Path, *run_args: str) -> subprocess.Popen:
    """``gpreempt run RUN_ARGS`` where ``runtime_dir`` is mounted read-only."""
    command = " ".join(f"'{a}'" for a in (sys.executable, "-m", "gpreempt", "run", *run_args))
    d = f"'{runtime_dir}'"
    script = f"mount --bind {d} {d} && mount -o remount,bind,ro {d} {d} && exec {command}"
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=gp_env(runtime_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _task(runtime_dir: Path, name: str) -> dict:
    return next((t for t in status(runtime_dir)["tasks"] if t["name"] == name), {})


def test_a_client_needs_only_to_connect_to_the_socket(runtime_dir: Path, tmp_path: Path) -> None:
    daemon = Daemon(runtime_dir)
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    before = sorted(os.listdir(runtime_dir))
    done = tmp_path / "done"
    run = _run_read_only(
        runtime_dir, "-p", "low", "--name", "ro", "--", sys.executable, str(script), str(done)
    )
    try:
        assert wait_for(lambda: _task(runtime_dir, "ro").get("active"), 15), run.stderr
        assert _task(runtime_dir, "ro")["processes"] == 1  # its channel, through the mount
        done.touch()  # the request ends, and the client with it
        _out, err = run.communicate(timeout=20)
        assert run.returncode == 0, err
        assert "Traceback" not in err
        assert sorted(os.listdir(runtime_dir)) == before  # nothing created by the client
    finally:
        if run.poll() is None:
            run.kill()
        daemon.stop()


def test_run_waits_for_a_node_daemon_that_is_not_up_yet(runtime_dir: Path, tmp_path: Path) -> None:
    # a read-only directory without a daemon: none can start there; the command runs without
    # preemption and is registered once the node's daemon answers
    script = tmp_path / "client.py"
    script.write_text(CLIENT.replace("with gpreempt.request():\n    ", ""))
    done = tmp_path / "done"
    run = _run_read_only(
        runtime_dir, "-p", "low", "--name", "early", "--", sys.executable, str(script), str(done)
    )
    daemon = None
    try:
        time.sleep(1.0)
        assert run.poll() is None
        assert not (runtime_dir / "gpreempt.sock").exists()
        daemon = Daemon(runtime_dir)
        assert wait_for(lambda: _task(runtime_dir, "early"), 10)
        done.touch()
        _out, err = run.communicate(timeout=20)
        assert run.returncode == 0, err
        assert "read-only" in err and "without preemption" in err, err
        assert "Traceback" not in err
    finally:
        if run.poll() is None:
            run.kill()
        if daemon is not None:
            daemon.stop()
