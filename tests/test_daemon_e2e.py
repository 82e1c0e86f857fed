"""The daemon, launcher and client with real processes and the signal mechanism (no GPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    Counter,
    Daemon,
    gpreempt,
    process_state,
    run_counter,
    spawn,
    task_named,
    tasks,
    wait_for,
)

HIGH_REQUEST = """
import gpreempt, os, sys, time
time.sleep(0.3)
with gpreempt.request():
    open(sys.argv[1], "w").write("in")
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end and not (sys.argv[3:] and os.path.exists(sys.argv[3])):
        time.sleep(0.01)
open(sys.argv[1], "w").write("out")
time.sleep(0.5)
"""


def start_high_request(
    runtime_dir: Path, tmp_path: Path, marker: Path, seconds: float, release: Path | None = None
) -> subprocess.Popen:
    """`gpreempt run -p high` of a script that holds one request() for ``seconds``, or until
    the file ``release`` exists; it writes "in" to ``marker`` inside the request and "out"
    after it."""
    script = tmp_path / "high.py"
    script.write_text(HIGH_REQUEST)
    until = [] if release is None else [str(release)]
    return spawn(
        runtime_dir, "run", "-p", "high", "--name", "server", "--",
        "python3", str(script), str(marker), str(seconds), *until,
    )  # fmt: skip


def test_low_task_stops_while_high_request_open(
    daemon: Daemon, runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    low = run_counter(
        runtime_dir, counter_script, progress, "--priority", "low", "--name", "trainer"
    )
    try:
        counter = Counter(progress)
        assert wait_for(lambda: counter.value() > 0), "low task never ran"
        assert wait_for(lambda: task_named(runtime_dir, "trainer") is not None)
        marker = tmp_path / "marker"
        high = start_high_request(runtime_dir, tmp_path, marker, 2.0)
        assert wait_for(lambda: marker.exists() and marker.read_text() == "in", 10)
        time.sleep(0.2)  # let the suspension land
        status = task_named(runtime_dir, "trainer")
        assert status["state"] == "suspended"
        assert counter.progress_over(0.8) == 0, "low task progressed inside the request"
        assert wait_for(lambda: marker.read_text() == "out", 10)
        assert counter.advances(5), "low task did not resume"
        assert high.wait(10) == 0
        trainer = task_named(runtime_dir, "trainer")
        assert trainer["state"] == "running"
        assert trainer["preemptions"] >= 1
        assert trainer["suspended_seconds"] > 1.0
        assert trainer["last_mechanism"] == "signal"
    finally:
        low.send_signal(signal.SIGTERM)
        low.wait(10)
    events = gpreempt(runtime_dir, "events", "--json", "--last", "0").stdout.splitlines()
    kinds = [json.loads(line)["event"] for line in events]
    for kind in ("registered", "active", "suspend", "idle", "resume", "exit"):
        assert kind in kinds


def test_run_forwards_exit_code_and_signals(daemon: Daemon, runtime_dir: Path) -> None:
    result = gpreempt(runtime_dir, "run", "--", "python3", "-c", "import sys; sys.exit(7)")
    assert result.returncode == 7
    proc = spawn(runtime_dir, "run", "--", "python3", "-c", "import time; time.sleep(30)")
    # Seen registered through the CLI, as before: the launcher takes over SIGTERM only once it
    # supervises its command, a moment after the daemon lists the task; a SIGTERM sent the
    # moment the listing (asked in-process) shows it could come first and kill the launcher.
    assert wait_for(lambda: len(json.loads(gpreempt(runtime_dir, "status", "--json").stdout)
                                ["tasks"]) == 1)  # fmt: skip
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM


def test_run_unknown_command_is_usage_error(daemon: Daemon, runtime_dir: Path) -> None:
    result = gpreempt(runtime_dir, "run", "--", "no-such-command-xyz")
    assert result.returncode == 2
    assert "command not found" in result.stderr


@pytest.mark.parametrize("priority", ["urgent", "256", "-300", "1.5", ""])
def test_bad_priority_exits_2(runtime_dir: Path, priority: str) -> None:
    result = gpreempt(runtime_dir, "run", "--priority", priority, "--", "true")
    assert result.returncode == 2
    assert "priority" in result.stderr


def test_high_killed_inside_request_resumes_low(
    daemon: Daemon, runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    low = run_counter(runtime_dir, counter_script, progress, "-p", "low", "--name", "trainer")
    counter = Counter(progress)
    assert wait_for(lambda: counter.value() > 0)
    marker = tmp_path / "marker"
    high = start_high_request(runtime_dir, tmp_path, marker, 60)
    try:
        assert wait_for(lambda: marker.exists(), 10)
        assert wait_for(lambda: task_named(runtime_dir, "trainer")["state"] == "suspended", 5)
        server = task_named(runtime_dir, "server")
        os.kill(server["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        assert counter.advances(5)
        assert time.monotonic() - killed_at < 1.5
        assert high.wait(10) == 128 + signal.SIGKILL
    finally:
        low.send_signal(signal.SIGTERM)
        low.wait(10)


def test_daemon_sigkill_launcher_resumes_child(
    runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:
    daemon = Daemon(runtime_dir)
    progress = tmp_path / "progress"
    low = run_counter(runtime_dir, counter_script, progress, "-p", "low", "--name", "trainer")
    try:
        counter = Counter(progress)
        assert wait_for(lambda: counter.value() > 0)
        assert gpreempt(runtime_dir, "suspend", "trainer").returncode == 0
        pid = task_named(runtime_dir, "trainer")["pid"]
        assert wait_for(lambda: process_state(pid) == "T", 2)
        daemon.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        assert wait_for(lambda: process_state(pid) not in ("T", ""), 2)
        assert time.monotonic() - killed_at < 1.0
        assert counter.advances(2)
        # A new daemon: the launcher registers again with it.
        daemon = Daemon(runtime_dir)
        assert wait_for(lambda: task_named(runtime_dir, "trainer") is not None, 5)
    finally:
        low.send_signal(signal.SIGTERM)
        low.wait(10)
        daemon.stop()


def test_new_daemon_resumes_attached_process(
    runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:

    progress = tmp_path / "progress"
    proc = subprocess.Popen(["python3", str(counter_script), str(progress)], start_new_session=True)
    daemon = Daemon(runtime_dir)
    try:
        result = gpreempt(
            runtime_dir, "attach", "--pid", str(proc.pid), "-p", "low", "--name", "job"
        )
        assert result.returncode == 0, result.stderr
        assert gpreempt(runtime_dir, "suspend", str(proc.pid)).returncode == 0
        assert wait_for(lambda: process_state(proc.pid) == "T", 2)
        daemon.stop(signal.SIGKILL)
        time.sleep(0.3)
        assert process_state(proc.pid) == "T"  # nobody else knew about it
        daemon = Daemon(runtime_dir)
        assert wait_for(lambda: process_state(proc.pid) not in ("T", ""), 2)
        records = [json.loads(x) for x in (runtime_dir / "events.jsonl").read_text().splitlines()]
        assert any(
            r["event"] == "resume" and "previous daemon" in (r["reason"] or "") for r in records
        )
    finally:
        proc.kill()
        proc.wait()
        daemon.stop()


def test_sigterm_resumes_suspended_tasks(
    runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:

    proc = subprocess.Popen(
        ["python3", str(counter_script), str(tmp_path / "p")], start_new_session=True
    )
    daemon = Daemon(runtime_dir)
    try:
        assert gpreempt(runtime_dir, "attach", "--pid", str(proc.pid)).returncode == 0
        assert gpreempt(runtime_dir, "suspend", str(proc.pid)).returncode == 0
        assert wait_for(lambda: process_state(proc.pid) == "T", 2)
        daemon.stop(signal.SIGTERM)
        assert process_state(proc.pid) not in ("T", "")
    finally:
        proc.kill()
        proc.wait()


def test_manual_suspend_resume_overrides_policy(
    daemon: Daemon, runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    job = run_counter(runtime_dir, counter_script, progress, "--name", "job")
    try:
        counter = Counter(progress)
        assert wait_for(lambda: counter.value() > 0)
        assert gpreempt(runtime_dir, "suspend", "job").returncode == 0
        assert task_named(runtime_dir, "job")["state"] == "held"
        time.sleep(0.1)
        assert counter.progress_over(0.4) == 0
        assert gpreempt(runtime_dir, "resume", "job").returncode == 0
        assert task_named(runtime_dir, "job")["state"] == "running"
        assert counter.advances(3)
        kinds = [
            json.loads(x)["event"] for x in (runtime_dir / "events.jsonl").read_text().splitlines()
        ]
        assert "hold" in kinds and "release" in kinds
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(10)


def test_python_api_suspend_resume(
    daemon: Daemon, runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:

    import gpreempt as gp

    proc = subprocess.Popen(
        ["python3", str(counter_script), str(tmp_path / "p")], start_new_session=True
    )
    try:
        assert (
            gpreempt(runtime_dir, "attach", "--pid", str(proc.pid), "--name", "py").returncode == 0
        )
        assert gp.suspend("py", runtime_dir=runtime_dir)["state"] == "held"
        assert wait_for(lambda: process_state(proc.pid) == "T", 2)
        assert gp.resume("py", runtime_dir=runtime_dir)["state"] == "running"
        assert wait_for(lambda: process_state(proc.pid) not in ("T", ""), 2)
        assert [t["name"] for t in gp.status(runtime_dir)["tasks"]] == ["py"]
    finally:
        proc.kill()
        proc.wait()


def test_attached_task_ends_when_process_exits(daemon: Daemon, runtime_dir: Path) -> None:
    # A process that exits when told to (its stdin closes), not after a time that a loaded
    # machine may spend before `attach` has even started.
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert gpreempt(runtime_dir, "attach", "--pid", str(proc.pid)).returncode == 0
    assert [t["pid"] for t in tasks(runtime_dir)] == [proc.pid]
    proc.stdin.close()
    assert proc.wait(10) == 0
    assert wait_for(lambda: tasks(runtime_dir) == [], 3)


def test_equal_priorities_never_suspend_each_other(
    daemon: Daemon, runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:
    a = run_counter(runtime_dir, counter_script, tmp_path / "a", "--always-active", "--name", "a")
    b = run_counter(runtime_dir, counter_script, tmp_path / "b", "--always-active", "--name", "b")
    try:
        assert wait_for(lambda: len(tasks(runtime_dir)) == 2)
        time.sleep(0.3)
        assert {t["state"] for t in tasks(runtime_dir)} == {"running"}
    finally:
        for p in (a, b):
            p.send_signal(signal.SIGTERM)
            p.wait(10)


PERIODIC_REQUESTS = """
import gpreempt, sys, time
while True:
    with gpreempt.request():
        time.sleep(0.3)
    time.sleep(0.3)
"""


def test_clients_carry_over_to_a_new_daemon(
    runtime_dir: Path, counter_script: Path, tmp_path: Path
) -> None:
    """After a SIGKILL, the launchers register again and the in-process client hands its
    control block to the new daemon: requests preempt the low task again."""
    daemon = Daemon(runtime_dir)
    script = tmp_path / "periodic.py"
    script.write_text(PERIODIC_REQUESTS)
    low = run_counter(
        runtime_dir, counter_script, tmp_path / "progress", "-p", "low", "--name", "trainer"
    )
    high = spawn(runtime_dir, "run", "-p", "high", "--name", "server", "--", "python3", str(script))
    try:
        assert wait_for(lambda: (task_named(runtime_dir, "trainer") or {}).get("preemptions"), 10)
        daemon.stop(signal.SIGKILL)
        daemon = Daemon(runtime_dir)
        assert wait_for(
            lambda: (task_named(runtime_dir, "trainer") or {}).get("preemptions", 0) >= 2, 15
        ), "requests of the server did not reach the new daemon"
    finally:
        for proc in (low, high):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        daemon.stop()


LOW_WATCHER = """
import os, sys, time
import gpreempt
from gpreempt.client import session
assert session.current() is not None, "not under gpreempt run"
path = sys.argv[1]
while True:
    with open(path + ".tmp", "w") as f:
        f.write("1" if gpreempt.should_yield() else "0")
    os.replace(path + ".tmp", path)
    time.sleep(0.01)
"""


def _start_watcher(runtime_dir: Path, tmp_path: Path, seen: Path) -> subprocess.Popen:
    """A low task that writes 1 to ``seen`` while ``should_yield()`` says a more important task
    is active.

    Mechanism gate without a gate (no PyTorch here): the daemon cannot stop this process, so
    it keeps reporting what its watch shows."""
    script = tmp_path / "watcher.py"
    script.write_text(LOW_WATCHER)
    return spawn(
        runtime_dir, "run", "-p", "low", "--mechanism", "gate", "--name", "trainer", "--",
        "python3", str(script), str(seen),
    )  # fmt: skip


def _watched_while_high_requests(runtime_dir: Path, tmp_path: Path) -> tuple[bool, bool, bool]:
    """(low saw the high task active inside its request, low saw it idle after it, status
    said the low task watches the high one)."""
    seen = tmp_path / "seen"
    low = _start_watcher(runtime_dir, tmp_path, seen)
    try:
        assert wait_for(lambda: seen.exists(), 10), "the low task never started"
        marker, release = tmp_path / "marker", tmp_path / "release"
        high = start_high_request(runtime_dir, tmp_path, marker, 30, release)
        assert wait_for(lambda: marker.exists() and marker.read_text() == "in", 10)
        active = wait_for(lambda: seen.read_text() == "1", 1.0)
        server_id = task_named(runtime_dir, "server")["task_id"]
        listed = task_named(runtime_dir, "trainer")["watching"] == [server_id]
        release.touch()  # the request ends
        assert wait_for(lambda: marker.read_text() == "out", 10)
        idle = wait_for(lambda: seen.read_text() == "0", 2.0)
        assert high.wait(10) == 0
        return active, idle, listed
    finally:
        low.send_signal(signal.SIGTERM)
        low.wait(10)


def test_a_low_task_watches_its_users_high_task_directly(
    daemon: Daemon, runtime_dir: Path, tmp_path: Path
) -> None:
    active, idle, listed = _watched_while_high_requests(runtime_dir, tmp_path)
    assert active, "the low task never saw the high task's request through its watch"
    assert idle, "the watch still showed the high task active after its request"
    assert listed, "gpreempt status does not show what the low task watches"


def test_no_watch_sends_nothing_to_watch(runtime_dir: Path, tmp_path: Path) -> None:
    daemon = Daemon(runtime_dir, "--no-watch")
    try:
        active, _idle, listed = _watched_while_high_requests(runtime_dir, tmp_path)
        assert not active and not listed
    finally:
        daemon.stop()


def test_a_watched_task_killed_inside_its_request_counts_as_idle(
    daemon: Daemon, runtime_dir: Path, tmp_path: Path
) -> None:
    seen = tmp_path / "seen"
    low = _start_watcher(runtime_dir, tmp_path, seen)
    marker = tmp_path / "marker"
    try:
        assert wait_for(lambda: seen.exists(), 10)
        high = start_high_request(runtime_dir, tmp_path, marker, 60)
        assert wait_for(lambda: marker.exists(), 10)
        assert wait_for(lambda: seen.read_text() == "1", 5)
        os.kill(task_named(runtime_dir, "server")["pid"], signal.SIGKILL)
        assert wait_for(lambda: seen.read_text() == "0", 5), "the watch kept a dead task active"
        assert high.wait(10) == 128 + signal.SIGKILL
    finally:
        low.send_signal(signal.SIGTERM)
        low.wait(10)
