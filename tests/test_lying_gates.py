"""With a real daemon and real processes: a client that writes gate words it does not honour
hurts nobody but itself (docs/robustness.md, "Bounds").

The liar registers as a low task, claims an installed gate in its control block and runs on
whatever its gate word says. Where no driver lock exists (this CPU machine), the daemon must
find it running from what the kernel counts (its CPU time while its gate is closed), stop it
with signals and say so; in a turn group, its honest peer must stop waiting for its turns.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import (
    HOLDING_SERVER,
    Counter,
    Daemon,
    gp_env,
    process_state,
    status,
    wait_for,
)
from hostile import NOBODY, become, needs_root

#: A low task that claims a gate (``gate_installed``) and work in flight, then runs a CPU loop
#: that never reads its gate word. argv: runtime dir, progress file.
LIAR = """
import os, sys
import gpreempt
from gpreempt.control import OFF_GATE_INSTALLED
session = gpreempt.attach("low", name="liar", gate=False, runtime_dir=sys.argv[1])
session.control._set32(OFF_GATE_INSTALLED, 1)
session.control.set_auto_active(True)
path, tmp, i = sys.argv[2], sys.argv[2] + ".tmp", 0
while True:
    i += 1
    if i % 2000 == 0:
        with open(tmp, "w") as f:
            f.write(str(i))
        os.replace(tmp, path)
"""

#: A low task that claims a gate and honours it: it works only while its gate word lets it,
#: and writes how long it found its gate closed. argv: runtime dir, report file.
HONEST = """
import json, os, sys, time
import gpreempt
from gpreempt.control import OFF_GATE_INSTALLED
session = gpreempt.attach("low", name="honest", gate=False, runtime_dir=sys.argv[1])
session.control._set32(OFF_GATE_INSTALLED, 1)
session.control.set_auto_active(True)
path, tmp = sys.argv[2], sys.argv[2] + ".tmp"
closed, last_write = 0.0, 0.0
while True:
    now = time.monotonic()
    if session.must_wait():
        time.sleep(0.0005)
        closed += time.monotonic() - now
    else:
        sum(i * i for i in range(2000))
    if now - last_write > 0.05:
        with open(tmp, "w") as f:
            json.dump({"at": now, "closed": closed}, f)
        os.replace(tmp, path)
        last_write = now
"""


def _python(runtime_dir: Path, script: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), str(runtime_dir), *args],
        env=gp_env(runtime_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _task(runtime_dir: Path, name: str) -> dict:
    return next((t for t in status(runtime_dir)["tasks"] if t["name"] == name), {})


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait(10)


def test_a_claimed_gate_that_does_not_hold_is_stopped_with_signals(
    runtime_dir: Path, tmp_path: Path
) -> None:
    # its gate word closed outright: by default a gate that watches its own user's server
    # goes on by itself when the server is idle (a word the check leaves alone, written only
    # below tasks of the same user); below another user's task, its word is always so
    daemon = Daemon(runtime_dir, "--no-watch-resume")
    progress, go, inside = tmp_path / "progress", tmp_path / "go", tmp_path / "inside"
    release = tmp_path / "release"
    liar = _python(runtime_dir, _write(tmp_path, "liar.py", LIAR), str(progress))
    server_script = _write(tmp_path, "server.py", HOLDING_SERVER)
    server = _python(runtime_dir, server_script, str(go), str(inside), "30", str(release))
    counter = Counter(progress)
    try:
        assert wait_for(lambda: counter.value() > 0 and _task(runtime_dir, "server"), 20)
        go.touch()
        assert wait_for(inside.exists, 10)
        # held by its gate, it runs on for a moment; then the kernel's count of its CPU time
        # gives it away, and signals stop it
        assert wait_for(lambda: process_state(liar.pid) == "T", 2.5), "the liar runs on"
        assert counter.progress_over(0.3) == 0
        task = _task(runtime_dir, "liar")
        assert task["state"] == "suspended" and task["backstop"] == "signal", task
        assert task["gate"]["hold_leaks"] >= 1 and not task["gate"]["trusted"], task
        events = (runtime_dir / "events.jsonl").read_text().splitlines()
        errors = [json.loads(e) for e in events if '"error"' in e and '"liar"' in e]
        assert any("CPU" in e.get("reason", "") for e in errors), errors
        # the request ends: it runs again
        release.touch()
        assert wait_for(lambda: not inside.exists(), 10)
        assert counter.advances(5)
        assert process_state(liar.pid) != "T"
        assert _task(runtime_dir, "liar")["backstop"] is None
    finally:
        _stop(liar, server)
        daemon.stop()


def _closed_over(report: Path, seconds: float) -> float:
    """The share of ``seconds`` the honest peer found its gate closed."""

    def read() -> dict:
        return json.loads(report.read_text())

    first = read()
    time.sleep(seconds)
    last = read()
    return (last["closed"] - first["closed"]) / max(1e-9, last["at"] - first["at"])


def test_a_peer_stops_waiting_for_the_turns_of_one_that_runs_through_them(
    runtime_dir: Path, tmp_path: Path
) -> None:
    daemon = Daemon(runtime_dir)
    progress, report = tmp_path / "progress", tmp_path / "report"
    go, inside = tmp_path / "go", tmp_path / "inside"
    server_script = _write(tmp_path, "server.py", HOLDING_SERVER)
    server = _python(runtime_dir, server_script, str(go), str(inside), "1")  # idle
    honest = _python(runtime_dir, _write(tmp_path, "honest.py", HONEST), str(report))
    liar = _python(runtime_dir, _write(tmp_path, "liar.py", LIAR), str(progress))
    counter = Counter(progress)
    try:
        assert wait_for(lambda: report.exists() and counter.value() > 0, 20)
        assert wait_for(lambda: _task(runtime_dir, "server"), 10)
        # the two take turns below the idle server; the liar's turns are found out, and the
        # honest peer no longer waits for them
        assert wait_for(lambda: _task(runtime_dir, "liar")["gate"]["hold_leaks"] >= 1, 5)
        time.sleep(0.3)
        assert _closed_over(report, 1.5) < 0.05
        task = _task(runtime_dir, "liar")
        assert not task["gate"]["trusted"] and task["state"] == "running", task
        assert process_state(liar.pid) != "T"
    finally:
        _stop(liar, honest, server)
        daemon.stop()


def test_two_honest_peers_keep_taking_turns(runtime_dir: Path, tmp_path: Path) -> None:
    # the check finds no leak in a peer that waits for its turns
    daemon = Daemon(runtime_dir)
    first, second = tmp_path / "first", tmp_path / "second"
    go, inside = tmp_path / "go", tmp_path / "inside"
    server_script = _write(tmp_path, "server.py", HOLDING_SERVER)
    server = _python(runtime_dir, server_script, str(go), str(inside), "1")
    honest_script = _write(tmp_path, "honest.py", HONEST)
    one = _python(runtime_dir, honest_script, str(first))
    other_text = HONEST.replace('name="honest"', 'name="honest-2"')
    two = _python(runtime_dir, _write(tmp_path, "honest2.py", other_text), str(second))
    try:
        assert wait_for(lambda: first.exists() and second.exists(), 20)
        assert wait_for(lambda: _task(runtime_dir, "server"), 10)
        time.sleep(1.5)
        assert _closed_over(first, 1.0) > 0.2  # they take turns
        for name in ("honest", "honest-2"):
            gate = _task(runtime_dir, name)["gate"]
            assert gate["hold_leaks"] == 0 and gate["trusted"], gate
    finally:
        _stop(one, two, server)
        daemon.stop()


def _liar_as(uid: int, runtime_dir: Path, progress: Path) -> int:
    """A forked child that becomes ``uid`` and runs the liar's loop, claiming stream barriers
    (``barriers_on`` and an installed gate); its pid."""
    import gpreempt
    from gpreempt.client import session  # noqa: F401 - imported before the child drops root

    pid = os.fork()
    if pid == 0:
        try:
            become(uid)
            task = gpreempt.attach("low", name="liar", gate=False, runtime_dir=str(runtime_dir))
            task.control.set_barriers_on(True)
            i = 0
            while True:
                i += 1
                if i % 20000 == 0:
                    progress.write_text(str(i))
        finally:
            os._exit(1)
    return pid


@needs_root
def test_a_claim_of_barriers_below_another_users_task_is_stopped_with_signals(
    runtime_dir: Path, tmp_path: Path
) -> None:
    # its barriers would hold its work on the GPU, its gate words say: another user's server
    # need not believe that, so signals stop it once it has been held 50 ms (no lock here)
    os.chmod(runtime_dir, 0o755)
    daemon = Daemon(runtime_dir, "--shared")
    shared = Path(tempfile.mkdtemp(prefix="gp-liar-"))
    os.chmod(shared, 0o777)
    progress, go, inside = shared / "progress", tmp_path / "go", tmp_path / "inside"
    release = tmp_path / "release"
    liar = _liar_as(NOBODY, runtime_dir, progress)
    server_script = _write(tmp_path, "server.py", HOLDING_SERVER)
    server = _python(runtime_dir, server_script, str(go), str(inside), "30", str(release))
    counter = Counter(progress)
    try:
        assert wait_for(lambda: counter.value() > 0 and _task(runtime_dir, "server"), 20)
        assert _task(runtime_dir, "liar")["gate"]["barriers"]
        go.touch()
        assert wait_for(inside.exists, 10)
        assert wait_for(lambda: process_state(liar) == "T", 1.0), "the liar runs on"
        task = _task(runtime_dir, "liar")
        assert task["backstop"] == "signal" and task["gate"]["trusted"], task
        release.touch()
        assert wait_for(lambda: not inside.exists(), 10)
        assert counter.advances(5)
    finally:
        os.kill(liar, signal.SIGKILL)
        os.waitpid(liar, 0)
        _stop(server)
        daemon.stop()
        shutil.rmtree(shared, ignore_errors=True)
