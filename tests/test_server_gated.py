"""benchmarks/driver_gate/server_gated.py: each mode's medians over processes, and its bad
input (the processes themselves need a GPU)."""

from __future__ import annotations

import pytest
from conftest import check_says_no_gpu, load_script

SCRIPT = "benchmarks/driver_gate/server_gated.py"


def _process(idle: float, b2b: float, ahead: float) -> dict:
    return {
        kind: {"span_p50_ms": span, "wall_p50_ms": span + 0.05}
        for kind, span in (("idle", idle), ("b2b", b2b), ("ahead", ahead))
    }


def test_each_mode_keeps_every_process_and_their_median() -> None:
    rows = {
        "plain": [_process(1.18, 1.17, 1.17), _process(1.20, 1.19, 1.17)],
        "gated": [_process(1.33, 1.30, 1.18)],
        "probe-none": [],
    }
    out = load_script(SCRIPT).summarise(rows)
    assert out["plain"]["idle_span_p50_ms"] == {"runs": [1.18, 1.20], "median": pytest.approx(1.19)}
    assert out["plain"]["ahead_wall_p50_ms"]["runs"] == pytest.approx([1.22, 1.22])
    assert out["gated"]["b2b_span_p50_ms"]["median"] == 1.30
    assert "probe-none" not in out  # a mode cut before its first process is left out


def test_the_host_calls_and_the_gates_mode_are_kept_where_processes_tell_them() -> None:
    """Each call's host time: the median over the processes; the driver-level gate's mode at
    the end (3: CUPTI let go) and a probe's answer to letting go, per process."""
    first = {**_process(1.18, 1.17, 1.16), "calls_us": {"3-replay": 20.0}, "driver_mode": 3}
    second = {**_process(1.19, 1.17, 1.16), "calls_us": {"3-replay": 30.0}, "driver_mode": 1}
    probe = {**_process(1.18, 1.17, 1.16), "calls_us": {"3-replay": 18.0}, "detach_rc": 0}
    out = load_script(SCRIPT).summarise({"gated": [first, second], "probe-finalize": [probe]})
    assert out["gated"]["calls_us"] == {"3-replay": pytest.approx(25.0)}
    assert out["gated"]["driver_mode"] == [3, 1] and "detach_rc" not in out["gated"]
    assert out["probe-finalize"]["detach_rc"] == [0]


def test_an_unknown_mode_is_named_in_one_line(capsys) -> None:
    assert load_script(SCRIPT).main(["--modes", "plain,warm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "['warm']" in err and "probe-subscribe" in err


def test_without_a_gpu_it_says_so_in_one_line(capsys) -> None:
    torch = pytest.importorskip("torch")
    check_says_no_gpu(capsys, torch, SCRIPT, "--rounds", "1")
