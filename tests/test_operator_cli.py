"""What an operator sees: one-line errors, one exit-code convention, 80-column tables, the
state of a task that could not be suspended, and metrics that can be scraped."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import Daemon, gp_env, gpreempt, spawn, status, wait_for

from gpreempt.errors import GpreemptError, UsageError


def one_line_error(result: subprocess.CompletedProcess, command: str) -> str:
    """The single stderr line of a failed command; fails on a traceback or several lines."""
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gpreempt {command}: error: "), lines[0]
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ argument errors
def test_run_error_names_the_command_not_its_argv(runtime_dir: Path) -> None:
    result = gpreempt(runtime_dir, "run", "--priority", "urgent", "--", "true")
    assert result.returncode == 2
    assert "unknown priority 'urgent'" in one_line_error(result, "run")


@pytest.mark.parametrize(
    "args, command, text",
    [
        (("serve", "--metrics-port", "99999"), "serve", "out of range"),
        (("serve", "--metrics-port", "http"), "serve", "not a port number"),
        (("attach", "--pid", "0"), "attach", "not a process id"),
        (("attach", "--pid", "12ab"), "attach", "not a process id"),
        (("run", "--reserve-memory", "20XB", "--", "true"), "run", "bad memory size"),
        (("analyze", "trace", "--", "missing.py"), "analyze trace", "no such script"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    runtime_dir: Path, args: tuple[str, ...], command: str, text: str
) -> None:
    result = gpreempt(runtime_dir, *args)
    assert result.returncode == 2
    assert text in one_line_error(result, command)


def test_failed_profiled_command_leaves_no_trace(runtime_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the script runs under PyTorch's profiler
    script = tmp_path / "fails.py"
    script.write_text("raise SystemExit(3)\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "gpreempt", "analyze", "trace", "--", str(script)],
        env={**gp_env(runtime_dir), "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "the profiled command failed" in result.stderr
    left = [p.name for p in scratch.iterdir() if p.name.startswith("gpreempt-trace-")]
    assert left == []  # its trace is not left behind


@pytest.mark.parametrize("command", [("status",), ("events",), ("top", "--once")])
def test_no_daemon_is_exit_code_1_for_every_command(
    runtime_dir: Path, command: tuple[str, ...]
) -> None:
    result = gpreempt(runtime_dir, *command)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr


def test_switch_variables_are_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpreempt.client.agent import _flag
    from gpreempt.config import ENV_GATE

    for value in ("2", "disable"):
        monkeypatch.setenv(ENV_GATE, value)
        with pytest.raises(UsageError, match="GPREEMPT_GATE"):
            _flag(ENV_GATE, True)
    monkeypatch.setenv(ENV_GATE, "off")
    assert _flag(ENV_GATE, True) is False
    monkeypatch.delenv(ENV_GATE)
    assert _flag(ENV_GATE, True) is True


# ------------------------------------------------------------------ metrics endpoint
def test_busy_metrics_port_is_one_line_and_leaves_nothing(runtime_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = gpreempt(
            runtime_dir, "serve", "--runtime-dir", str(runtime_dir), "--metrics-port", str(port)
        )
    assert result.returncode == 2
    assert "the port is in use" in one_line_error(result, "serve")
    assert sorted(p.name for p in runtime_dir.iterdir()) == []  # no socket, no lock


# ------------------------------------------------------------------ narrow terminals
def status_reply() -> dict:
    task = {
        "task_id": 3,
        "pid": 13757,
        "name": "resnet-server",
        "priority": 100,
        "priority_name": "high",
        "gpus": [0],
        "mechanism": "auto",
        "state": "running",
        "active": True,
        "preemptions": 0,
        "turns": 2,
        "suspended_seconds": 0.0,
        "last_suspend_ms": None,
        "last_mechanism": None,
        "gate": {"waits": 12345},
    }
    low = {
        **task,
        "task_id": 4,
        "pid": 13758,
        "name": "transformer-train",
        "priority": -100,
        "priority_name": "low",
        "mechanism": "gate",
        "state": "unprotected",
        "suspend_error": "suspend failed: process 13758 is connected but its gate is not installed",
        "preemptions": 1234,
        "suspended_seconds": 12345.678,
        "last_suspend_ms": 0.125,
        "last_mechanism": "gate",
    }
    daemon = {"pid": 1, "policy": "hpf", "runtime_dir": "/run/gpreempt", "lock_available": True}
    return {"daemon": daemon, "tasks": [task, low]}


@pytest.mark.parametrize("width", [80, 100])
def test_status_fits_the_terminal_without_cutting_cells(
    width: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpreempt.cli.status import print_status

    monkeypatch.setenv("COLUMNS", str(width))
    print_status(status_reply())
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if re.match(r"\s*1375[78] ", line)]  # the rows
    assert len(table) == 2, out
    assert all(len(line) <= width for line in table), out
    assert "…" not in out
    for word in ("unprotected", "running", "transformer-train", "resnet-server", "12345.678"):
        assert word in out
    assert "13,757" not in out
    assert re.search(r"unprotected.*transformer-train.*gate is not", out.replace("\n", " "))


def test_top_fits_80_columns() -> None:
    import io

    from rich.console import Console

    from gpreempt.cli.top import build_frame
    from gpreempt.nvml import GpuInfo, NvmlSnapshot

    snap = NvmlSnapshot([GpuInfo(0, "NVIDIA H200", "GPU-0", 91, 30, 20 << 30, 141 << 30, [])])
    reply = status_reply()
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(
        build_frame({"daemon": reply["daemon"], "tasks": reply["tasks"]}, None, snap, 0, width=80)
    )
    out = buf.getvalue()
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert "…" not in out and "13,757" not in out
    for word in ("unprotected", "running", "13757", "NVIDIA H200"):
        assert word in out


# ------------------------------------------------------------------ a failed suspension
def test_failed_suspension_is_the_state_unprotected(runtime_dir: Path) -> None:
    """A gated low task whose gate is not there cannot be suspended: status says so with the
    reason, the metrics count it, the log has one line, and it clears when nothing needs
    suspending any more."""
    port = free_port()
    daemon = Daemon(runtime_dir, "--metrics-port", str(port))
    low = high = None
    try:
        low = spawn(
            runtime_dir, "run", "-p", "low", "--mechanism", "gate", "--name", "trainer",
            "--", sys.executable, "-c", "import time; time.sleep(60)",
        )  # fmt: skip
        high = spawn(
            runtime_dir, "run", "-p", "high", "--always-active", "--name", "server",
            "--", "sleep", "60",
        )  # fmt: skip

        def trainer() -> dict | None:
            try:
                tasks = status(runtime_dir)["tasks"]
            except GpreemptError:  # no daemon answers
                tasks = []
            return next((t for t in tasks if t["name"] == "trainer"), None)

        assert wait_for(lambda: (trainer() or {}).get("state") == "unprotected", 15)
        reason = trainer()["suspend_error"]
        assert "has not connected its in-process client" in reason
        text = gpreempt(runtime_dir, "status")
        assert "unprotected" in text.stdout and "has not connected" in text.stdout
        time.sleep(0.5)  # the daemon retries; the log must not grow with every retry
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        body = body.decode()
        failures = re.search(
            r'gpreempt_suspend_failures_total\{[^}]*task="trainer"[^}]*\} (\S+)', body
        )
        assert failures and float(failures.group(1)) >= 1, body
        assert re.search(
            r'gpreempt_task_state\{[^}]*state="unprotected",task="trainer"\} 1\.0', body
        )
        assert re.search(r'gpreempt_tasks\{[^}]*state="unprotected"\} 1\.0', body)
        assert "gpreempt_build_info{" in body
        events = gpreempt(runtime_dir, "events", "--json", "--last", "0").stdout.splitlines()
        errors = [e for e in map(json.loads, events) if e["event"] == "error"]
        assert len(errors) == 1, errors
        high.terminate()
        high.wait(10)
        high = None
        assert wait_for(lambda: (trainer() or {}).get("state") == "running", 10)
        assert trainer()["suspend_error"] is None
        low.terminate()
        low.wait(10)
        low = None
        # the ended task's series are gone
        assert wait_for(
            lambda: (
                'task="trainer"'
                not in urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                .read()
                .decode()
            ),
            10,
        )
    finally:
        for proc in (low, high):
            if proc is not None:
                proc.kill()
                proc.wait()
        daemon.stop()


def test_reserve_memory_is_refused_without_the_driver(daemon: Daemon, runtime_dir: Path) -> None:
    status = json.loads(gpreempt(runtime_dir, "status", "--json").stdout)
    if status["daemon"]["lock_available"]:
        pytest.skip("this machine has the driver's checkpoint API: eviction can work")
    result = gpreempt(runtime_dir, "run", "--reserve-memory", "1GiB", "--", "true")
    assert result.returncode == 2
    assert "--reserve-memory needs memory eviction" in result.stderr
    assert os.path.exists(runtime_dir / "gpreempt.sock")
