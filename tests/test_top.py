"""gpreempt top: one frame from a daemon status and an NVML snapshot."""

from __future__ import annotations

import io

from rich.console import Console

from gpreempt import nvml
from gpreempt.cli import main
from gpreempt.cli.top import build_frame
from gpreempt.nvml import NA, GpuInfo, NvmlSnapshot

STATUS = {
    "ok": True,
    "daemon": {"pid": 4321, "policy": "hpf", "runtime_dir": "/tmp/x", "started_at": 0.0},
    "tasks": [
        {
            "task_id": 1,
            "pid": 100,
            "name": "train",
            "priority": -100,
            "priority_name": "low",
            "gpus": [0],
            "mechanism": "auto",
            "state": "suspended",
            "active": True,
            "always_active": False,
            "preemptions": 42,
            "suspended_seconds": 3.5,
            "last_suspend_ms": 1.25,
            "last_mechanism": "driver_lock",
            "uid": 0,
            "gate": {
                "launches": 10,
                "waits": 7,
                "wait_seconds": 0.1,
                "window": 4,
                "installed": True,
            },
        },
        {
            "task_id": 2,
            "pid": 200,
            "name": "serve",
            "priority": 100,
            "priority_name": "high",
            "gpus": [0],
            "mechanism": "auto",
            "state": "running",
            "active": True,
            "always_active": False,
            "preemptions": 0,
            "suspended_seconds": 0.0,
            "last_suspend_ms": None,
            "last_mechanism": None,
            "uid": 0,
            "gate": None,
        },
    ],
}


def render(renderable) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(renderable)
    return buf.getvalue()


def test_frame_with_daemon_and_gpus():
    snap = NvmlSnapshot([GpuInfo(0, "NVIDIA H200", "GPU-0", 91, 30, 20 << 30, 141 << 30, [])])
    out = render(build_frame(STATUS, None, snap, now=0))
    assert "daemon pid 4321" in out and "policy hpf" in out
    assert "NVIDIA H200" in out and "91" in out
    lines = out.splitlines()
    serve = next(i for i, line in enumerate(lines) if "serve" in line)
    train = next(i for i, line in enumerate(lines) if "train" in line)
    assert serve < train  # higher priority first
    assert "suspended" in lines[train] and "42" in lines[train] and "3.50" in lines[train]
    assert "driver_lock" in lines[train] and "1.25" in lines[train]


def test_frame_without_daemon_or_nvml():
    snap = NvmlSnapshot([], unavailable="NVIDIA driver not loaded")
    out = render(build_frame(None, "no gpreempt daemon answers at /x", snap, now=0))
    assert "no daemon (no gpreempt daemon answers at /x)" in out
    assert "NVML unavailable: NVIDIA driver not loaded" in out


def test_frame_with_unsupported_fields():
    na = NA("not supported on this GPU")
    snap = NvmlSnapshot([GpuInfo(0, na, na, na, na, na, na, na)])
    out = render(build_frame(STATUS, None, snap, now=0))
    assert "n/a" in out


def test_once_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(nvml, "open_nvml", lambda lib=None: NA("no NVIDIA driver here"))
    rc = main(["top", "--once", "--runtime-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1  # nothing answered: the same code as `status` and `events`
    assert "no daemon" in out and "NVML unavailable: no NVIDIA driver here" in out


def test_bad_interval(tmp_path, capsys):
    assert main(["top", "--interval", "0", "--runtime-dir", str(tmp_path)]) == 2
    assert "--interval" in capsys.readouterr().err
