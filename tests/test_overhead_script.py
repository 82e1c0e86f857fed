"""benchmarks/driver_gate/overhead.py: what its copies without gpreempt are given."""

from __future__ import annotations

from conftest import load_script


def test_control_gets_the_frameworks_settings_of_a_low_task_and_ungated_nothing() -> None:
    """So that JAX's gated copy, whose XLA graphs ``gpreempt run`` turns off, is read against
    a copy with the same XLA."""
    overhead = load_script("benchmarks/driver_gate/overhead.py")
    env = {"PATH": "/usr/bin", "XLA_FLAGS": "--xla_gpu_autotune_level=2"}
    control = overhead.plain_env("control", env)
    assert control["XLA_FLAGS"] == "--xla_gpu_autotune_level=2 --xla_gpu_enable_command_buffer="
    assert control["PATH"] == "/usr/bin"
    assert overhead.plain_env("ungated", env) == env


def test_each_turn_knows_its_place_in_its_round_and_the_copy_before_it() -> None:
    overhead = load_script("benchmarks/driver_gate/overhead.py")
    records = [
        {"config": "ungated", "turn": "0:1.5", "steps": 3},
        {"config": "defaults", "turn": "0:1.5", "steps": 4},
        {"config": "defaults", "turn": "1:1.5", "steps": 5},
    ]
    orders = [["ungated", "defaults"], ["defaults", "ungated"]]
    out = overhead.placed(records, orders)
    assert [(r["place"], r["after"]) for r in out] == [(0, ""), (1, "ungated"), (0, "")]
    assert out[1]["steps"] == 4 and "place" not in records[0]


def test_each_gated_turn_says_how_many_launches_its_gate_saw(tmp_path) -> None:
    """An asleep gate's callbacks see nothing; one woken by its process's backlog sees part of
    what the awake copy's see: the table puts that beside the ratios."""
    overhead = load_script("benchmarks/driver_gate/overhead.py")
    assert overhead.gate_counts(tmp_path) is None  # no daemon there: a figure missing, no error
    first, then = {"launches": 100, "barriers": 7}, {"launches": 400, "barriers": 9}
    assert overhead.counted(first, then) == {"launches": 300, "barriers": 2}
    assert overhead.counted(None, then) is None
    turns = [
        {"kind": "k", "config": "defaults", "steps": 10, "gate": {"launches": 0, "barriers": 1}},
        {"kind": "k", "config": "defaults", "steps": 10, "gate": {"launches": 300, "barriers": 9}},
        {"kind": "k", "config": "defaults", "steps": 10, "gate": {"launches": 500, "barriers": 9}},
        {"kind": "k", "config": "awake", "steps": 20, "gate": None},
        {"kind": "k", "config": "ungated", "steps": 20},
    ]
    assert overhead.seen_per_step(turns, "k", "defaults") == 30.0
    assert overhead.seen_per_step(turns, "k", "awake") is None
    assert overhead.seen_per_step(turns, "k", "ungated") is None
