"""benchmarks/driver_gate/server_spread.py: each mode's spread over processes (the processes
themselves need a GPU)."""

from __future__ import annotations

import pytest
from conftest import check_says_no_gpu, load_script


def test_each_mode_keeps_every_process_and_its_spread() -> None:
    rows = {"benchmark": [1.30, 1.26, 1.28], "heuristics": [1.22, 1.21], "benchmark-busy": []}
    out = load_script("benchmarks/driver_gate/server_spread.py").summarise(rows)
    assert out["benchmark"] == {"spans_p50_ms": [1.30, 1.26, 1.28], "min": 1.26, "max": 1.30,
                                "median": 1.28}  # fmt: skip
    assert out["heuristics"]["median"] == pytest.approx(1.215)
    assert "benchmark-busy" not in out  # a mode cut before its first process is left out


def test_without_a_gpu_it_says_so_in_one_line(capsys) -> None:
    torch = pytest.importorskip("torch")
    check_says_no_gpu(capsys, torch, "benchmarks/driver_gate/server_spread.py", "--rounds", "1")


def test_an_unknown_mode_is_named_in_one_line(capsys) -> None:
    script = load_script("benchmarks/driver_gate/server_spread.py")
    assert script.main(["--modes", "heuristics,warm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "['warm']" in err and "heuristics-ballast" in err
