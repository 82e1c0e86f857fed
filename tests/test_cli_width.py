"""Every command's --help and output fit an 80-column terminal."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Daemon, gp_env
from rich.console import Console
from test_cli_status import DAEMON, _task

from gpreempt.cli import build_parser

WIDTH = 80


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command's parser, by the words that name it."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


def _too_wide(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > WIDTH]


def test_every_help_fits_80_columns(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    commands = _commands(build_parser())
    assert len(commands) > 15  # every command, the nested ones included
    for words, parser in commands:
        assert _too_wide(parser.format_help()) == [], " ".join(("gpreempt", *words))


def _status_text(tasks: list[dict]) -> str:
    from gpreempt.cli.status import print_status

    out = io.StringIO()
    console = Console(file=out, width=WIDTH, highlight=False, emoji=False)
    daemon = {**DAEMON, "runtime_dir": "/run/user/1000/gpreempt", "turn_ms": 20}
    print_status({"daemon": {**daemon, "lock_available": False}, "tasks": tasks}, console)
    return out.getvalue()


def test_status_keeps_every_column_at_80_columns() -> None:
    trainer = _task(
        pid=1234567,
        name="python3",
        state="suspended",
        preemptions=1234,
        suspended_seconds=1234.5,
        last_suspend_ms=0.123,
        last_mechanism="gate",
    )
    server = _task(pid=1234568, name="serve", priority=100, priority_name="high")
    text = _status_text([trainer, server])
    assert _too_wide(text) == []
    header = next(line for line in text.splitlines() if "pid" in line and "name" in line)
    for column in ("state", "active", "mechanism", "preempted", "suspended s", "last ms"):
        assert column in header, column
    assert "0.123" in text and "gate" in text


def test_top_once_fits_80_columns(monkeypatch) -> None:
    from test_top import STATUS

    from gpreempt.cli.top import build_frame
    from gpreempt.nvml import GpuInfo, NvmlSnapshot

    gpu = GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-0", 91, 30, 20 << 30, 80 << 30, [])
    out = io.StringIO()
    Console(file=out, width=WIDTH).print(
        build_frame(STATUS, None, NvmlSnapshot([gpu]), now=0, width=WIDTH)
    )
    assert _too_wide(out.getvalue()) == [] and "train" in out.getvalue()


def test_top_without_a_terminal_writes_frames(runtime_dir: Path, daemon: Daemon) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpreempt", "top", "--interval", "0.2"],
        env={**gp_env(runtime_dir), "COLUMNS": str(WIDTH)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()  # blocks until a frame is written, not until exit
        assert "gpreempt top" in first and f"daemon pid {daemon.process.pid}" in first
        time.sleep(0.5)
    finally:
        proc.terminate()  # not SIGINT: a shell's background job starts with it ignored
        out, _err = proc.communicate(10)
    assert (first + out).count("gpreempt top") >= 2  # frame after frame
    assert _too_wide(first + out) == []


def test_demo_table_fits_80_columns() -> None:
    from gpreempt.cli.demo import show

    rows = [
        {"scenario": name, "p50": 123.45, "p99": 1234.56, "p99_ratio": 10.5, "b": 1234.5}
        | {"b_kept": 0.5, "note": ""}
        for name in ("Case-A alone", "Case-B alone", "both, no gpreempt", "both, gpreempt")
    ]
    out = io.StringIO()
    show(Console(file=out, width=WIDTH), rows)
    assert _too_wide(out.getvalue()) == []


@pytest.mark.parametrize("command", [["queues"], ["stop"]])
def test_plain_commands_fit_80_columns(command: list[str], runtime_dir: Path) -> None:
    env = {**gp_env(runtime_dir), "COLUMNS": str(WIDTH)}
    env.pop("GPREEMPT_RUNTIME_DIR")
    result = subprocess.run(
        [sys.executable, "-m", "gpreempt", *command, "--runtime-dir", str(runtime_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr
    assert _too_wide(result.stdout) == [], result.stdout
    assert os.path.isdir(runtime_dir)
