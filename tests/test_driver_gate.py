"""The driver-level gate without a GPU: where ``gpreempt run`` loads it, with what settings, and
its own channel to the daemon (the CUDA driver's call of ``InitializeInjection`` simulated).

Building the library needs the CUDA toolkit's headers (``cuda.h``, ``cupti.h``); those tests
skip without them. Its GPU behaviour is tested in ``tests/gpu/test_driver_gate_gpu.py``.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import gp_env, gpreempt, spawn, status, stop_all, wait_for

from gpreempt.client.gate import driver, driver_build
from gpreempt.errors import GpreemptError, UsageError


def _library() -> Path:
    try:
        return driver_build.build()
    except driver_build.DriverGateUnavailable as exc:
        pytest.skip(f"the driver-level gate cannot be built here: {exc}")


def test_settings_follow_priority_and_mechanism() -> None:
    low = driver.driver_config_for(-100, closes_gate=True)
    assert low.bound and low.auto_activity
    assert not driver.driver_config_for(100, closes_gate=True).bound  # nothing preempts it
    assert not driver.driver_config_for(-100, closes_gate=False).bound  # signal, lock: no gate
    assert low.environment()["GPREEMPT_DRIVER_BOUND"] == "1"


@pytest.mark.parametrize(
    ("variable", "passed_as", "default", "value", "passed", "bad", "complaint"),
    [
        # spaces the barriers as it does the operator gate's; 0 puts none
        ("GPREEMPT_GATE_BARRIER_MS", "GPREEMPT_DRIVER_BARRIER_US", "200", "0.4", "400", "fast",
         "='fast' is not a number"),
        # bounds the work in flight as it does the operator gate's open window
        ("GPREEMPT_GATE_OPEN_WINDOW_MS", "GPREEMPT_DRIVER_WINDOW_MS", "25", "2.5", "2.5", "-1",
         "='-1' must be >= 0"),
    ],
)  # fmt: skip
def test_the_gate_variables_the_user_set_reach_the_driver_level_gate(
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    passed_as: str,
    default: str,
    value: str,
    passed: str,
    bad: str,
    complaint: str,
) -> None:
    """The operator gate's variables set the driver-level gate's barriers and window too; a
    bad value is one line naming the variable."""
    assert driver.driver_config_for(-100, True).environment()[passed_as] == default
    monkeypatch.setenv(variable, value)
    assert driver.driver_config_for(-100, True).environment()[passed_as] == passed
    monkeypatch.setenv(variable, bad)
    with pytest.raises(UsageError, match=variable + complaint):
        driver.driver_config_for(-100, True)


def test_no_barriers_where_the_user_set_a_spacing_of_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPREEMPT_GATE_BARRIER_MS", "0")
    assert driver.driver_config_for(-100, True).barrier_us == 0


def test_a_variable_the_user_set_is_kept_and_said() -> None:
    extra, note = driver.command_environment(
        {"CUDA_INJECTION64_PATH": "/opt/nsys/libToolsInjection64.so"}, -100, True
    )
    assert extra == {}
    assert note is not None and "libToolsInjection64.so" in note and "driver lock" in note


def test_the_gate_can_be_turned_off() -> None:
    assert driver.command_environment({"GPREEMPT_DRIVER_GATE": "0"}, -100, True) == ({}, None)


def test_no_toolkit_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_build, "_toolkit_roots", lambda: [])
    with pytest.raises(driver_build.DriverGateUnavailable, match="no CUDA toolkit headers"):
        driver_build.find_include_dirs()


def test_the_library_exports_what_the_driver_and_the_client_call() -> None:
    lib = ctypes.CDLL(str(_library()))
    for name in (
        "InitializeInjection",
        "gpreempt_driver_adopt",
        "gpreempt_driver_set_watch",
        "gpreempt_driver_release",
        "gpreempt_driver_resume",
        "gpreempt_driver_state",
        "gpreempt_driver_take_activity",
    ):
        assert hasattr(lib, name), name


def test_run_loads_it_into_the_command(daemon, runtime_dir) -> None:
    path = _library()
    script = "import os; print(os.environ.get('CUDA_INJECTION64_PATH'))"
    reply = gpreempt(runtime_dir, "run", "--priority", "low", "--", sys.executable, "-c", script)
    assert reply.returncode == 0, reply.stderr
    assert reply.stdout.strip() == str(path)


def test_a_task_held_by_the_driver_lock_runs_without_it(tmp_path) -> None:
    # CUDA's checkpoint lock refuses a process that loaded a tools library
    from gpreempt.client.launcher import child_environment
    from gpreempt.messages import TaskFields

    path = _library()
    gated = child_environment(tmp_path, TaskFields(priority=-100, mechanism="gate"))
    assert gated.get("CUDA_INJECTION64_PATH") == str(path)
    locked = child_environment(tmp_path, TaskFields(priority=-100, mechanism="lock"))
    assert "CUDA_INJECTION64_PATH" not in locked


#: A program with no Python client of its own (it imports nothing of gpreempt) whose CUDA
#: "starts": it calls InitializeInjection as the driver would at cuInit, then reports the
#: watch list its gate holds. Without libcuda here, the gate's state is "failed" (it cannot
#: hold launches) but its channel works.
OWN_CHANNEL = """
import ctypes, os, sys, time
lib = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
lib.InitializeInjection()
out = sys.argv[1]
while True:
    with open(out + ".tmp", "w") as f:
        f.write(str(lib.gpreempt_driver_watch_version()))
    os.replace(out + ".tmp", out)
    time.sleep(0.05)
"""


def test_a_program_without_python_client_opens_its_own_channel(daemon, runtime_dir, tmp_path):
    _library()
    version = tmp_path / "version"
    low = spawn(
        runtime_dir, "run", "--priority", "low", "--name", "native", "--",
        sys.executable, "-S", "-c", OWN_CHANNEL, str(version),
    )  # fmt: skip
    high = None
    try:

        def native() -> dict | None:
            try:
                tasks = status(runtime_dir)["tasks"]
            except GpreemptError:  # no daemon answers
                tasks = []
            return next((t for t in tasks if t["name"] == "native" and t.get("gate")), None)

        assert wait_for(lambda: native() is not None, 20)
        task = native()
        assert task is not None and task["gate"]["driver"] == "failed"  # no libcuda here
        assert version.read_text() == "0"  # nothing to watch yet
        server = "from gpreempt.client import session; import time\n"
        server += "session.current(); time.sleep(60)"
        high = spawn(runtime_dir, "run", "--priority", "high", "--", sys.executable, "-c", server)
        assert wait_for(lambda: version.exists() and int(version.read_text() or 0) > 0, 20)
    finally:
        stop_all(low, *([high] if high else []))


#: A server that registers as a high task, then, once told to, opens a request and stays inside
#: it; a process it forks keeps its block mapped and writes "cleared" once the word drops.
STRANDED_SERVER = """
import os, pathlib, sys, time
from gpreempt.client.connection import DaemonClient
from gpreempt.control_block import ControlBlock
block = ControlBlock.create()
client = DaemonClient.connect(sys.argv[1])
client.open_channel(block.memfd, block.doorbell, register={"priority": "high", "name": "server"})
print("ready", flush=True)
sys.stdin.readline()
block.set_requests(1)
if os.fork() == 0:
    while block.stats().requests:
        time.sleep(0.02)
    pathlib.Path(sys.argv[2]).write_text("cleared")
    os._exit(0)
print("inside", flush=True)
time.sleep(600)
"""


def test_a_watched_server_that_exits_in_a_request_after_the_daemon_is_cleared(
    daemon, runtime_dir, tmp_path
):
    """Barriers of a C++ program wait on a server's words; the daemon is killed, then the
    server, inside a request: the program's own channel clears the server's words, as nobody
    else is left to. (The request opens once the daemon is gone: the gate cannot hold here,
    without libcuda, so the daemon would stop the program with signals.)"""
    _library()
    version, cleared = tmp_path / "version", tmp_path / "cleared"
    low = spawn(
        runtime_dir, "run", "--priority", "low", "--name", "native", "--",
        sys.executable, "-S", "-c", OWN_CHANNEL, str(version),
    )  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-c", STRANDED_SERVER, str(runtime_dir), str(cleared)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=gp_env(runtime_dir),
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    try:
        assert server.stdout.readline().strip() == "ready"
        assert wait_for(lambda: version.exists() and int(version.read_text() or 0) > 0, 20)
        daemon.process.kill()
        daemon.process.wait(10)
        server.stdin.write("open\n")
        server.stdin.flush()
        assert server.stdout.readline().strip() == "inside"
        time.sleep(0.5)
        assert not cleared.exists()  # the server lives on inside its request: still held
        server.kill()
        assert wait_for(cleared.exists, 10), "the server's words stay raised"
    finally:
        stop_all(low)
        server.kill()
        server.wait(10)


ADOPT = """
import ctypes, gc, json, os, sys
from gpreempt.control_block import ControlBlock
from gpreempt.client.gate import driver
cfg = driver.DriverConfig(bound=True, auto_activity=False)
block, other = ControlBlock.create(), ControlBlock.create()
taken = driver.adopt(block.memfd, block.doorbell, cfg, torch_gate=False)
again = driver.adopt(block.memfd, block.doorbell, cfg, torch_gate=True)  # PyTorch came later
refused = driver.adopt(other.memfd, other.doorbell, cfg, torch_gate=False)
driver.library().InitializeInjection()  # as the driver would at cuInit (no libcuda here)
state = block.driver_gate
block.close(); del block; gc.collect()  # the interpreter lets go of its mapping
print(json.dumps([taken, again, refused, state, driver.state()]))
"""


def test_a_python_process_hands_its_block_to_the_gate() -> None:
    path = str(_library())
    env = {**os.environ, "CUDA_INJECTION64_PATH": path, "GPREEMPT_DRIVER_GATE": path}
    env.pop("GPREEMPT_TASK_ID", None)
    reply = subprocess.run(
        [sys.executable, "-c", ADOPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert reply.returncode == 0, reply.stderr
    taken, again, refused, state, after = json.loads(reply.stdout)
    assert (taken, again, refused) == (True, True, False)
    assert state == "failed" and after == "failed"  # no libcuda on this machine


TAKE = """
import json
from gpreempt.control_block import ControlBlock
from gpreempt.client.gate import driver
server = driver.DriverConfig(bound=False, auto_activity=True)
block = ControlBlock.create()
before = driver.take_activity()  # no block yet
driver.adopt(block.memfd, block.doorbell, server, torch_gate=True)
block.set_auto_active(True)  # as the operator gate left it when it handed it over
taken = driver.take_activity()
print(json.dumps([before, taken, block.stats().auto_active]))
"""


def test_the_gate_takes_activity_over_only_with_a_block_that_tells_it() -> None:
    path = str(_library())
    env = {**os.environ, "CUDA_INJECTION64_PATH": path, "GPREEMPT_DRIVER_GATE": path}
    env.pop("GPREEMPT_TASK_ID", None)
    for auto_activity in (True, False):  # a task that tells no activity takes none
        script = TAKE.replace("auto_activity=True", f"auto_activity={auto_activity}")
        reply = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert reply.returncode == 0, reply.stderr
        assert json.loads(reply.stdout) == [False, auto_activity, True]  # the word left as it was


def test_a_cache_another_user_could_write_is_refused(tmp_path, monkeypatch) -> None:
    # the library runs in every process of the user's commands: never one planted by others
    _library()
    shared = tmp_path / "shared"
    (shared / "driver_gate").mkdir(parents=True)
    shared.chmod(0o777)
    monkeypatch.setenv("GPREEMPT_CACHE_DIR", str(shared))
    with pytest.raises(driver_build.DriverGateUnavailable, match="not a private directory"):
        driver_build.build()
