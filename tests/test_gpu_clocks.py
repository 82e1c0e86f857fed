"""benchmarks/driver_gate/gpu_clocks.py: the GPU's clocks sampled through NVML, in the format
held_progress.py --clocks reads (an NVML stand-in here; the real one needs a GPU)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from conftest import load_script


def _fake_nvml(throttle_api: bool = False) -> ModuleType:
    nvml = ModuleType("pynvml")
    nvml.NVML_CLOCK_SM = 1
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: ("gpu", index)
    nvml.nvmlDeviceGetClockInfo = lambda handle, which: 1980 if which == 1 else 0
    nvml.nvmlDeviceGetPowerUsage = lambda handle: 415000
    nvml.nvmlDeviceGetTemperature = lambda handle, sensor: 45
    reasons = "nvmlDeviceGetCurrentClocksThrottleReasons" if throttle_api else (
        "nvmlDeviceGetCurrentClocksEventReasons")  # fmt: skip
    setattr(nvml, reasons, lambda handle: 4)
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: SimpleNamespace(gpu=60)
    return nvml


@pytest.mark.parametrize("throttle_api", [False, True])
def test_each_line_is_one_sample(tmp_path: Path, monkeypatch, throttle_api: bool):
    """A driver before 535 names the clock-event reasons throttle reasons: the same bitmask."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(throttle_api))
    out = tmp_path / "clocks.jsonl"
    script = load_script("benchmarks/driver_gate/gpu_clocks.py")
    assert script.main(["--out", str(out), "--seconds", "0.02", "--every-ms", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= 2
    assert all(row[1:6] == [1980, 415000, 45, 4, 60] for row in rows)
    assert all(len(row) == 13 for row in rows)
    assert rows[0][10] is None and all(row[10] > -1.0 for row in rows[1:])  # woke late (ms)
    assert all(row[11] >= 0 and row[12] > 0 for row in rows)  # NVML reads (ms), CPU probe (us)
    assert rows == sorted(rows)


def test_the_hosts_cpu_contention(tmp_path: Path):
    """/proc/stat's steal (the eighth count of the "cpu" line, in clock ticks) and
    procs_running, /proc/pressure/cpu's "some" total, the cgroup's throttled time (found from
    /proc/self/cgroup); what a kernel does not say is None."""
    script = load_script("benchmarks/driver_gate/gpu_clocks.py")
    proc = tmp_path / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "stat").write_text(
        "cpu  4705 356 584 3699 23 23 0 250 0 0\ncpu0 1393 280 283 1018 9 9 0 125 0 0\n"
        "intr 1462898\nctxt 2541\nprocs_running 7\nprocs_blocked 0\n"
    )
    (proc / "pressure" / "cpu").write_text(
        "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    (proc / "self").mkdir()
    (proc / "self" / "cgroup").write_text("0::/pods/trainer\n")
    cgroups = tmp_path / "cgroup"
    cpu_stat = script.cgroup_cpu_stat(proc, cgroups)
    assert cpu_stat == cgroups / "pods" / "trainer" / "cpu.stat"
    cpu_stat.parent.mkdir(parents=True)
    cpu_stat.write_text("usage_usec 9000\nnr_periods 40\nnr_throttled 3\nthrottled_usec 2500\n")
    runnable, stall, steal, throttled = script.host_sample(proc, cpu_stat)
    assert runnable == 7 and stall == 123456 and throttled == pytest.approx(0.0025)
    assert steal == pytest.approx(250 / os.sysconf("SC_CLK_TCK"))
    (proc / "pressure" / "cpu").unlink()
    (proc / "stat").write_text("cpu  1 2 3 4\nprocs_running 3\n")  # no steal counted
    cpu_stat.write_text("usage_usec 9000\n")  # no CPU controller: no throttling counted
    assert script.host_sample(proc, cpu_stat) == [3, None, None, None]
    none = tmp_path / "none"
    assert script.host_sample(none, none / "cpu.stat") == [None, None, None, None]


def test_without_nvml_one_line(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    script = load_script("benchmarks/driver_gate/gpu_clocks.py")
    assert script.main(["--out", str(tmp_path / "c.jsonl"), "--seconds", "1"]) == 2
    assert "needs nvidia-ml-py" in capsys.readouterr().err
