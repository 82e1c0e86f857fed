"""Full disks, lost directories, restarts, recycled pids and shared process groups hurt
neither the daemon nor anyone's job (docs/robustness.md says what happens on each)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import Daemon, gp_env, gpreempt, process_state, spawn, wait_for
from hostile import NOBODY, needs_root, sleepers

from gpreempt.client.connection import DaemonClient
from gpreempt.errors import UsageError
from gpreempt.runtime_dir import prepare_runtime_dir


def task_pids(runtime_dir: Path) -> list[int]:
    with DaemonClient.connect(runtime_dir) as client:
        return [t["pid"] for t in client.status()["tasks"]]


# 6 -------------------------------------------------------------------------------------
@needs_root
def test_a_full_disk_is_counted_never_fatal_and_shutdown_resumes_everything() -> None:
    mount = Path(tempfile.mkdtemp(prefix="gp-full-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mount)]).returncode:
        os.rmdir(mount)
        pytest.skip("cannot mount a small tmpfs here")
    runtime_dir = mount / "rt"
    try:
        daemon = Daemon(runtime_dir)
        with sleepers(3) as (held, ending, later), DaemonClient.connect(runtime_dir) as client:
            for proc in (held, ending, later):
                client.register(proc.pid, priority="low")
            client.hold(held.pid, True)
            assert wait_for(lambda: process_state(held.pid) == "T", 2)
            with contextlib.suppress(OSError), open(mount / "filler", "wb") as f:
                while True:
                    f.write(b"x" * 4096)
                    f.flush()
            ending.kill()  # its exit is an event the disk has no room for
            ending.wait()
            time.sleep(0.6)
            for _ in range(40):  # more events than the log's last page holds
                client.hold(later.pid, True)
                client.hold(later.pid, False)
            # a stop that cannot be recorded first is not made: a daemon killed now would
            # leave it stopped for good
            client.hold(later.pid, True)
            time.sleep(0.3)
            assert process_state(later.pid) != "T"
            (task,) = [t for t in client.status()["tasks"] if t["pid"] == later.pid]
            assert task["state"] == "unprotected" and "not stopped" in task["suspend_error"]
            # an attached task a restarted daemon would not know is refused, not half-managed
            with sleepers(1) as (unrecorded,):
                with pytest.raises(UsageError, match="cannot record attached process"):
                    client.register(unrecorded.pid, priority="low")
                assert unrecorded.pid not in task_pids(runtime_dir)
            status = client.status()["daemon"]
            assert status["event_write_failures"] > 0
            assert status["state_write_failures"] > 0
            assert daemon.process.poll() is None
            daemon.stop(signal.SIGKILL)  # what it stopped was recorded before the disk filled
            Daemon(runtime_dir).stop()
            assert process_state(held.pid) != "T" and process_state(later.pid) != "T"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        os.rmdir(mount)


# 7 -------------------------------------------------------------------------------------
def test_killing_a_launcher_while_its_command_is_stopped_never_kills_the_command(
    daemon: Daemon, runtime_dir: Path
) -> None:
    """A stopped group orphaned by its launcher's death got SIGHUP (35 of 40 tries)."""
    for _ in range(3):
        launcher = spawn(runtime_dir, "run", "--priority", "low", "--", "sleep", "600")
        assert wait_for(lambda: len(task_pids(runtime_dir)) == 1, 10)
        (child,) = task_pids(runtime_dir)
        try:
            with DaemonClient.connect(runtime_dir) as client:
                client.hold(child, True)
            assert wait_for(lambda c=child: process_state(c) == "T", 2)
            launcher.kill()
            launcher.wait()
            assert wait_for(lambda: task_pids(runtime_dir) == [], 5)  # its task ended
            time.sleep(0.2)
            assert process_state(child) in ("S", "R"), "the command died with its launcher"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


# 8 -------------------------------------------------------------------------------------
def test_attached_tasks_survive_a_daemon_restart(runtime_dir: Path) -> None:
    with sleepers(2) as (attached, recycled):
        first = Daemon(runtime_dir)
        try:
            with DaemonClient.connect(runtime_dir) as client:
                client.register(attached.pid, priority="low", name="trainer")
        finally:
            first.stop(signal.SIGKILL)
        # a record whose pid now names another process (another start time) is not taken
        state = runtime_dir / "attached.json"
        records = json.loads(state.read_text())
        records.append({**records[0], "pid": recycled.pid, "name": "stale", "start_time": 1})
        state.write_text(json.dumps(records))
        second = Daemon(runtime_dir)
        try:
            with DaemonClient.connect(runtime_dir) as client:
                tasks = client.status()["tasks"]
            assert [(t["pid"], t["name"], t["priority"]) for t in tasks] == [
                (attached.pid, "trainer", -100)
            ]
        finally:
            second.stop()


# 9 -------------------------------------------------------------------------------------
def test_a_deleted_runtime_directory_is_taken_again_and_never_split(
    daemon: Daemon, runtime_dir: Path
) -> None:
    with sleepers(1) as (proc,):
        with DaemonClient.connect(runtime_dir) as client:
            client.register(proc.pid, priority="low")
            client.hold(proc.pid, True)
        assert wait_for(lambda: process_state(proc.pid) == "T", 2)
        subprocess.run(["rm", "-rf", str(runtime_dir)], check=True)
        assert wait_for(daemon.answers, 5), "the daemon did not take its directory again"
        assert task_pids(runtime_dir) == [proc.pid]
        second = gpreempt(runtime_dir, "serve", "--runtime-dir", str(runtime_dir), timeout=10)
        assert second.returncode != 0 and "already serves" in second.stderr
        daemon.stop()
        assert process_state(proc.pid) != "T"


def test_a_daemon_that_lost_its_directory_to_another_resumes_all_and_stops(
    daemon: Daemon, runtime_dir: Path
) -> None:
    with sleepers(1) as (proc,):
        with DaemonClient.connect(runtime_dir) as client:
            client.register(proc.pid, priority="low")
            client.hold(proc.pid, True)
        assert wait_for(lambda: process_state(proc.pid) == "T", 2)
        # replace the directory with another daemon's at once (before the first notices)
        os.rename(runtime_dir, str(runtime_dir) + ".old")
        os.mkdir(runtime_dir, 0o700)
        import fcntl

        lock = os.open(runtime_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            daemon.process.wait(5)
            assert process_state(proc.pid) != "T"
        finally:
            os.close(lock)
            subprocess.run(["rm", "-rf", str(runtime_dir) + ".old"], check=False)


# 10 ------------------------------------------------------------------------------------
CHILD_JOINS_PARENTS_TASK = """
import os, sys
from gpreempt.client.connection import DaemonClient
from gpreempt.control_block import ControlBlock
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    try:
        with DaemonClient.connect(sys.argv[1]) as client:
            block = ControlBlock.create()
            client.open_channel(block.memfd, block.doorbell)
        print("accepted", flush=True)
    except Exception as exc:
        print("refused:", exc, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@needs_root
def test_a_channel_never_binds_to_another_users_task(runtime_dir: Path) -> None:
    os.chmod(runtime_dir, 0o755)
    daemon = Daemon(runtime_dir, "--shared")
    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD_JOINS_PARENTS_TASK, str(runtime_dir)],
        env=gp_env(runtime_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with DaemonClient.connect(runtime_dir) as client:
            client.register(parent.pid, priority="high", name="root-job")
        out, _ = parent.communicate("go\n", timeout=20)
        assert out.startswith("refused:") and "uid 0" in out, out
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()
        daemon.stop()


def test_a_channel_from_a_pid_that_changed_hands_is_refused(tmp_path: Path) -> None:
    """The connecting process's start time is kept: a recycled pid registers no one."""
    from gpreempt.control_block import ControlBlock
    from gpreempt.daemon.server import Daemon as DaemonServer
    from gpreempt.daemon.server import Peer
    from gpreempt.errors import NoSuchProcess

    server = DaemonServer(tmp_path)
    peer = Peer(1, None, os.getpid(), os.getuid())  # type: ignore[arg-type]
    peer.start_time = 1  # the process that connected started at another time
    block = ControlBlock.create()
    fds = [os.dup(block.memfd), os.dup(block.doorbell)]
    try:
        with pytest.raises(NoSuchProcess, match="has exited"):
            server.handlers.op_channel(peer, {"register": {"priority": "low"}}, fds)
    finally:
        block.close()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


# 11 ------------------------------------------------------------------------------------
@needs_root
def test_a_group_with_another_users_process_is_never_signalled_whole(
    daemon: Daemon, runtime_dir: Path
) -> None:
    def become_leader_as_nobody() -> None:
        os.setpgid(0, 0)
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    leader = subprocess.Popen(["sleep", "600"], preexec_fn=become_leader_as_nobody)
    time.sleep(0.1)
    root_member = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: os.setpgid(0, leader.pid))
    try:
        assert os.getpgid(root_member.pid) == leader.pid
        with DaemonClient.connect(runtime_dir) as client:
            client.register(leader.pid, priority="low")
            client.hold(leader.pid, True)
        assert wait_for(lambda: process_state(leader.pid) == "T", 2)
        time.sleep(0.2)
        assert process_state(root_member.pid) != "T", "a root process in the job was stopped"
    finally:
        for proc in (leader, root_member):
            proc.kill()
            proc.wait()


def test_a_group_of_one_owner_is_still_signalled_whole(daemon: Daemon, runtime_dir: Path) -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 600 & wait"], start_new_session=True)
    try:
        assert wait_for(lambda: len(_children(leader.pid)) == 1, 5)
        (helper,) = _children(leader.pid)
        with DaemonClient.connect(runtime_dir) as client:
            client.register(leader.pid, priority="low")
            client.hold(leader.pid, True)
        assert wait_for(lambda: process_state(helper) == "T", 2)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


# 13 ------------------------------------------------------------------------------------
def test_a_symlinked_runtime_directory_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    target = tmp_path / "project"
    target.mkdir(mode=0o755)
    (target / "daemon.lock").write_text("precious\n")
    link = Path(tempfile.mkdtemp(prefix="gp-")) / "rt"
    link.symlink_to(target)
    result = gpreempt(link, "serve", "--runtime-dir", str(link))
    assert result.returncode == 2 and "symbolic link" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert (target.stat().st_mode & 0o777) == 0o755
    assert (target / "daemon.lock").read_text() == "precious\n"


def test_an_existing_directory_open_to_others_is_refused_not_chmodded(tmp_path: Path) -> None:
    shared = tmp_path / "open"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UsageError, match="open to other users"):
        prepare_runtime_dir(shared)
    assert (shared.stat().st_mode & 0o777) == 0o777


def test_a_symlinked_lock_file_is_never_followed(runtime_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (runtime_dir / "daemon.lock").symlink_to(victim)
    result = gpreempt(runtime_dir, "serve", "--runtime-dir", str(runtime_dir))
    assert result.returncode == 2 and "symbolic link" in result.stderr
    assert victim.read_text() == "precious\n"


def test_a_new_runtime_directory_is_private(tmp_path: Path) -> None:
    made = prepare_runtime_dir(tmp_path / "a" / "rt")
    assert (made.stat().st_mode & 0o777) == 0o700


# 14 ------------------------------------------------------------------------------------
def test_run_with_a_daemon_that_never_answers_resumes_and_runs_with_a_warning(
    runtime_dir: Path,
) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(runtime_dir / "gpreempt.sock"))
    silent.listen(16)  # accepts into its backlog, never answers
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gpreempt", "run", "--", sys.executable, "-c", "print('ran')"],
            env={**gp_env(runtime_dir), "GPREEMPT_DAEMON_TIMEOUT_S": "0.5"},
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        silent.close()
    assert result.returncode == 0, result.stderr
    assert "ran" in result.stdout
    assert "did not answer" in result.stderr and "without preemption" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_daemon_and_its_ancestors_cannot_be_attached(daemon: Daemon, runtime_dir: Path) -> None:
    for pid in (daemon.process.pid, os.getpid(), 1):
        result = gpreempt(runtime_dir, "attach", "--pid", str(pid))
        assert result.returncode == 1, result
        assert "stopping it would stop the daemon" in result.stderr
    assert daemon.answers()


# 15 ------------------------------------------------------------------------------------
IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def test_a_signal_to_the_launcher_keeps_a_suspended_command_suspended(
    daemon: Daemon, runtime_dir: Path
) -> None:
    launcher = spawn(
        runtime_dir, "run", "--priority", "low", "--", sys.executable, "-c", IGNORES_TERM
    )
    try:
        assert wait_for(lambda: len(task_pids(runtime_dir)) == 1, 10)
        (child,) = task_pids(runtime_dir)
        with DaemonClient.connect(runtime_dir) as client:
            client.hold(child, True)
        assert wait_for(lambda: process_state(child) == "T", 2)
        launcher.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert process_state(child) == "T"
        with DaemonClient.connect(runtime_dir) as client:
            (task,) = client.status()["tasks"]
        assert task["state"] == "held"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        launcher.wait(10)
