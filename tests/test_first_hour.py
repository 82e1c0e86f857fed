"""What a newcomer meets in the first hour: names, messages, exit codes, stopping the daemon."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    Daemon,
    gp_env,
    gpreempt,
    process_state,
    spawn,
    status,
    stop_all,
    wait_for,
)

from gpreempt.cli import main
from gpreempt.config import SOCKET_NAME
from gpreempt.errors import GpreemptError


def tasks(runtime_dir: Path) -> list[dict]:
    try:
        return status(runtime_dir)["tasks"]
    except GpreemptError:  # no daemon answers
        return []


def events(runtime_dir: Path) -> list[dict]:
    result = gpreempt(runtime_dir, "events", "--json", "--last", "0")
    return [json.loads(line) for line in result.stdout.splitlines()]


def one_error_line(stderr: str, prog: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr
    return lines[0]


# ---------------------------------------------------------------- item 2: task names


def test_a_run_task_is_named_after_its_command(daemon: Daemon, runtime_dir: Path) -> None:
    first = spawn(runtime_dir, "run", "--", "sleep", "30")
    second = spawn(runtime_dir, "run", "--", "sleep", "30")
    try:
        assert wait_for(lambda: len(tasks(runtime_dir)) == 2)
        assert sorted(t["name"] for t in tasks(runtime_dir)) == ["sleep", "sleep-2"]
    finally:
        stop_all(first, second)


# ---------------------------------------------------------------- item 3: protected pids


def test_a_process_that_was_the_daemons_ancestor_can_be_attached_after(
    runtime_dir: Path,
) -> None:
    """The daemon starts under a shell that goes away (as under a `gpreempt run` that
    exits): the process above that shell is no longer its ancestor and may be attached."""
    socket = runtime_dir / SOCKET_NAME
    script = (
        f'( "{sys.executable}" -m gpreempt serve --runtime-dir "{runtime_dir}" '
        f'>/dev/null 2>&1 & while [ ! -S "{socket}" ]; do sleep 0.05; done ); exec cat'
    )
    holder = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, env=gp_env(runtime_dir))
    daemon_pid = None
    try:
        assert wait_for(lambda: gpreempt(runtime_dir, "status").returncode == 0, 15)
        daemon_pid = json.loads(gpreempt(runtime_dir, "status", "--json").stdout)["daemon"]["pid"]
        result = gpreempt(runtime_dir, "attach", "--pid", str(holder.pid))
        assert result.returncode == 0, result.stderr
        # the daemon itself stays protected
        refused = gpreempt(runtime_dir, "attach", "--pid", str(daemon_pid))
        assert refused.returncode == 1 and "ancestors" in refused.stderr
    finally:
        if daemon_pid is not None:
            gpreempt(runtime_dir, "stop")
        holder.stdin.close()
        holder.wait(10)


# ---------------------------------------------------------------- item 4: never active


def test_status_says_when_an_important_task_never_counted_as_active() -> None:
    from test_cli_status import _task

    from gpreempt.cli.status import never_active_lines

    trainer = _task(pid=5, name="trainer")
    server = _task(pid=6, name="server", priority=100, active=False, gate=None)
    (line,) = never_active_lines([trainer, server])
    assert "server" in line and "never active" in line and "--always-active" in line
    assert never_active_lines([server]) == []  # nobody below it: it does not matter
    for seen in (
        {"always_active": True},
        {"active": True},
        {"gate": {"launches": 3, "requests": 0}},
        {"gate": {"launches": 0, "requests": 1}},
    ):
        assert never_active_lines([trainer, {**server, **seen}]) == [], seen


# ---------------------------------------------------------------- item 6: analyze trace


def test_analyze_trace_without_pytorch_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    import importlib.util

    script = tmp_path / "x.py"
    script.write_text("print('ran')\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert main(["analyze", "trace", "--", str(script)]) == 1
    line = one_error_line(capsys.readouterr().err, "gpreempt analyze trace")
    assert "PyTorch is not installed" in line and "failed" not in line


def test_the_trace_wrapper_without_pytorch_runs_nothing(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from gpreempt.monitor.trace_wrapper import main\n"
        f"raise SystemExit(main([{str(tmp_path / 'o.json')!r}, '--', {str(script)!r}]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=gp_env(tmp_path), capture_output=True, text=True
    )
    from gpreempt.monitor.trace_wrapper import EXIT_NO_TORCH

    assert result.returncode == EXIT_NO_TORCH
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert not Path(str(script) + ".ran").exists()


# ---------------------------------------------------------------- item 7: events --follow


def test_events_follow_of_a_missing_directory_fails_at_once(tmp_path: Path) -> None:
    result = gpreempt(tmp_path, "events", "--follow", "--runtime-dir", str(tmp_path / "none"))
    assert result.returncode == 1
    assert "no event log" in one_error_line(result.stderr, "gpreempt events")


def test_events_follow_says_it_waits(tmp_path: Path) -> None:
    proc = spawn(tmp_path, "events", "--follow", "--runtime-dir", str(tmp_path))
    try:
        assert "waiting for a daemon" in proc.stderr.readline()
    finally:
        proc.terminate()
        proc.communicate(10)


# ---------------------------------------------------------------- item 8: --policy


def test_run_says_when_the_running_daemon_has_another_policy(
    daemon: Daemon, runtime_dir: Path
) -> None:
    other = gpreempt(runtime_dir, "run", "--policy", "timeslice", "--", "true")
    assert other.returncode == 0
    assert "uses policy hpf, not timeslice" in other.stderr and "gpreempt stop" in other.stderr
    same = gpreempt(runtime_dir, "run", "--policy", "hpf", "--", "true")
    assert same.returncode == 0 and "policy" not in same.stderr


# ---------------------------------------------------------------- item 9: exit codes


def test_an_unknown_option_is_said_by_its_subcommand(capsys) -> None:
    for words in (["serve"], ["status"], ["analyze", "trace"]):
        with pytest.raises(SystemExit) as exited:
            main([*words, "--bogus"])
        assert exited.value.code == 2
        prog = " ".join(["gpreempt", *words])
        line = one_error_line(capsys.readouterr().err, prog)
        assert "--bogus" in line and f"see {prog} --help" in line


def test_bench_without_a_gpu_could_not_be_done(monkeypatch, capsys, tmp_path: Path) -> None:
    from gpreempt.bench import device

    monkeypatch.setattr(device, "gpu_present", lambda: False)
    assert main(["bench", "--quick", "--out", str(tmp_path / "b")]) == 1
    assert "no NVIDIA GPU" in one_error_line(capsys.readouterr().err, "gpreempt bench")
    assert main(["bench", "--scenarios", "nonsense"]) == 2  # bad input is said first


# ---------------------------------------------------------------- item 10: wording


def test_gpu_and_memory_options_are_checked_in_the_users_words(
    monkeypatch, capsys, runtime_dir: Path
) -> None:
    from gpreempt.cli import _task_options

    monkeypatch.setenv("GPREEMPT_RUNTIME_DIR", str(runtime_dir))  # never the user's daemon

    assert main(["run", "--gpu", "99999", "--", "true"]) == 2
    line = one_error_line(capsys.readouterr().err, "gpreempt run")
    assert "--gpu 99999" in line and "request" not in line
    assert main(["run", "--reserve-memory", "99999999TiB", "--", "true"]) == 2
    line = one_error_line(capsys.readouterr().err, "gpreempt run")
    assert "1 PiB" in line and "request" not in line and not re.search(r"\d{10}", line)
    monkeypatch.setattr(_task_options, "gpu_count", lambda: 2)
    monkeypatch.setattr(_task_options, "has_gpu_node", lambda index: False)
    assert main(["run", "--gpu", "5", "--", "true"]) == 2
    assert "no GPU 5 on this machine (GPUs 0-1)" in capsys.readouterr().err
    assert _task_options.parse_gpus("0,1") == (0, 1)
    monkeypatch.setattr(_task_options, "gpu_count", lambda: 0)  # no GPU: a label, said so
    assert _task_options.parse_gpus("5") == (5,)
    assert "no GPU found" in capsys.readouterr().err


# ---------------------------------------------------------------- item 11: queues


def test_queues_on_a_machine_without_a_gpu(monkeypatch, capsys) -> None:
    from gpreempt.cli import queues

    monkeypatch.setattr(queues, "gpus_found", lambda: set())
    assert main(["queues"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no GPU on this machine") and len(out.splitlines()) == 1
    assert "NVML" not in out and "debugfs" not in out


def test_gpus_found_reads_device_nodes(tmp_path: Path) -> None:
    from gpreempt.cli.queues import gpus_found

    assert gpus_found(tmp_path) == set()
    (tmp_path / "nvidiactl").touch()
    assert gpus_found(tmp_path) == set()
    (tmp_path / "nvidia0").touch()
    (tmp_path / "kfd").touch()
    assert gpus_found(tmp_path) == {"nvidia", "amd"}


# ---------------------------------------------------------------- item 13: gpreempt stop


def test_stop_leaves_nothing_suspended(runtime_dir: Path, tmp_path: Path) -> None:
    started = gpreempt(runtime_dir, "run", "--", "true")  # says how to stop what it started
    assert "`gpreempt stop` stops it" in started.stderr
    low = spawn(runtime_dir, "run", "--priority", "low", "--name", "low", "--", "sleep", "60")
    high = spawn(
        runtime_dir, "run", "-p", "high", "--always-active", "--name", "high", "--", "sleep", "60"
    )
    try:
        assert wait_for(lambda: {t["name"]: t["state"] for t in tasks(runtime_dir)}.get("low")
                        == "suspended", 15)  # fmt: skip
        low_pid = next(t["pid"] for t in tasks(runtime_dir) if t["name"] == "low")
        assert process_state(low_pid) == "T"
        result = gpreempt(runtime_dir, "stop")
        assert result.returncode == 0, result.stderr
        assert "stopped the daemon" in result.stdout and "2 tasks run on" in result.stdout
        assert process_state(low_pid) not in ("T", "")  # resumed, and running on
        assert not (runtime_dir / SOCKET_NAME).exists()
        assert [e["event"] for e in events(runtime_dir)][-1] == "daemon-stop"
        again = gpreempt(runtime_dir, "stop")
        assert again.returncode == 0 and "nothing to stop" in again.stdout
        assert low.poll() is None and high.poll() is None  # the commands run on
    finally:
        stop_all(low, high)


# ---------------------------------------------------------------- item 14: how a task ended


def test_a_task_end_says_how_its_command_exited(daemon: Daemon, runtime_dir: Path) -> None:
    assert gpreempt(runtime_dir, "run", "--", "sh", "-c", "exit 3").returncode == 3
    killed = gpreempt(runtime_dir, "run", "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == 128 + signal.SIGTERM
    reasons = [e.get("reason") for e in events(runtime_dir) if e["event"] == "exit"]
    assert reasons == ["its command exited (code 3)", "its command was killed by SIGTERM"]


def test_a_killed_launcher_is_still_said_so(daemon: Daemon, runtime_dir: Path) -> None:
    launcher = spawn(runtime_dir, "run", "--", "sleep", "60")
    child = None
    try:
        assert wait_for(lambda: len(tasks(runtime_dir)) == 1)
        child = tasks(runtime_dir)[0]["pid"]
        launcher.kill()
        launcher.wait(10)
        assert wait_for(lambda: tasks(runtime_dir) == [])
        reasons = [e.get("reason") for e in events(runtime_dir) if e["event"] == "exit"]
        assert reasons == ["its launcher disconnected"]
    finally:
        if child is not None:
            subprocess.run(["kill", str(child)], check=False)
