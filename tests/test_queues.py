"""gpreempt queues: NVML joined with the daemon's registry; KFD debugfs from saved files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from test_nvml import FakeNvml
from test_top import STATUS

from gpreempt import nvml
from gpreempt.cli import main
from gpreempt.cli.queues import amd_view, nvidia_view
from gpreempt.nvml import NA

FIX = Path(__file__).parent / "fixtures" / "amd"


def test_nvidia_join_with_registry():
    fake = FakeNvml(
        processes=[
            SimpleNamespace(pid=100, usedGpuMemory=1 << 30),
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=2 << 30),
        ],
        util_samples=[SimpleNamespace(pid=100, smUtil=70)],
    )
    doc = nvidia_view(None, None, nvml_lib=fake, status=STATUS)
    procs = {p["pid"]: p for p in doc["gpus"][0]["processes"]}
    assert procs[100]["task"]["name"] == "train" and procs[100]["task"]["state"] == "suspended"
    assert procs[100]["sm_util"] == 70
    assert procs[os.getpid()]["task"] is None
    assert doc["daemon"] == {"running": True, "reason": None}
    assert [t["name"] for t in doc["registered_without_gpu_process"]] == ["serve"]


def test_nvidia_pid_filter():
    fake = FakeNvml(
        processes=[
            SimpleNamespace(pid=100, usedGpuMemory=1),
            SimpleNamespace(pid=101, usedGpuMemory=1),
        ]
    )
    doc = nvidia_view(None, 101, nvml_lib=fake, status=STATUS)
    assert [p["pid"] for p in doc["gpus"][0]["processes"]] == [101]
    assert doc["registered_without_gpu_process"] == []


def test_no_daemon_shows_nvml_only(tmp_path, monkeypatch, capsys):
    fake = FakeNvml(processes=[SimpleNamespace(pid=100, usedGpuMemory=1 << 30)])
    real = nvml.snapshot
    monkeypatch.setattr(nvml, "snapshot", lambda lib=None, with_processes=True: real(fake))
    rc = main(["queues", "--vendor", "nvidia", "--runtime-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "no daemon:" in out and "showing NVML only" in out and "NVIDIA H200" in out


def test_saved_kfd_files_json(capsys):
    rc = main(
        ["queues", "--json", "--mqds", str(FIX / "mqds.txt"), "--hqds", str(FIX / "hqds.txt")]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert "nvidia" not in doc
    procs = doc["amd"]["mqds"]["processes"]
    assert [p["pid"] for p in procs] == [157801, 157933, 160001]
    assert [q["type"] for q in procs[1]["queues"]] == ["compute", "compute", "diq"]
    assert all("device" in q for q in procs[0]["queues"])
    assert doc["amd"]["hqds"]["stopped_devices"] == ["9a1e"]
    assert doc["amd"]["hqds"]["nodes"][0]["cp_active"] == 3


def test_saved_kfd_files_tables_and_pid(capsys):
    rc = main(
        [
            "queues",
            "--pid",
            "157933",
            "--mqds",
            str(FIX / "mqds.txt"),
            "--hqds",
            str(FIX / "hqds.txt"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "157933" in out and "157801" not in out.split("hqds from")[0]
    assert "0x7f1a11800000" in out
    assert "device is stopped" in out
    assert "3 of 8 compute HQDs active" in out


def test_only_one_file_given():
    doc = amd_view(str(FIX / "mqds.txt"), None, None)
    assert doc["mqds"]["available"] and not doc["hqds"]["available"]
    assert "--hqds" in doc["hqds"]["reason"]


def test_live_debugfs_unavailable_says_why(tmp_path):
    doc = amd_view(None, None, None, debugfs_root=tmp_path / "debug" / "kfd")
    for name in ("mqds", "hqds"):
        assert not doc[name]["available"]
        assert doc[name]["reason"]


def test_missing_saved_file(capsys):
    assert main(["queues", "--mqds", "/nonexistent/mqds"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_nvml_na_in_view():
    doc = nvidia_view(None, None, nvml_lib=FakeNvml(init_error=9), status=None)
    assert doc["available"] is False and doc["reason"] == "NVIDIA driver not loaded"
    assert doc["daemon"]["running"] is False
    assert isinstance(NA("x"), NA)
