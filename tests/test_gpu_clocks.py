"""benchmarks/driver_gate/gpu_clocks.py: the GPU's clocks sampled through NVML, in the format
held_progress.py --clocks reads (an NVML stand-in here; the real one needs a GPU)."""

from __future__ import annotations

import json
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
    assert all(row[1:] == [1980, 415000, 45, 4, 60] for row in rows)
    assert rows == sorted(rows)


def test_without_nvml_one_line(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    script = load_script("benchmarks/driver_gate/gpu_clocks.py")
    assert script.main(["--out", str(tmp_path / "c.jsonl"), "--seconds", "1"]) == 2
    assert "needs nvidia-ml-py" in capsys.readouterr().err
