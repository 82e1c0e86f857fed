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


def test_the_table_tells_a_trainer_bound_by_its_cpu_from_one_bound_by_its_gpu(capsys) -> None:
    """A turn's queued work left after its loop and its main thread's CPU share, medians per
    configuration, printed beside the ratios; files written before they were recorded print
    as before."""
    overhead = load_script("benchmarks/driver_gate/overhead.py")
    turns = [
        {"kind": "k", "config": c, "turn": f"{r}:1", "steps": steps, "s": 1.0,
         "drain_s": drain, "loop_cpu": cpu}
        for r in range(3)
        for c, steps, drain, cpu in (("ungated", 60, 0.018, 0.5), ("awake", 54, 0.0008, 0.6))
    ]  # fmt: skip
    assert overhead.bound_by(turns, "k", "ungated") == "   drain 18.0 ms, cpu 0.50"
    assert overhead.bound_by(turns, "k", "awake") == "   drain 0.8 ms, cpu 0.60"
    assert overhead.bound_by(turns, "k", "control") == ""
    overhead.print_table(turns, ["k"], ())
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("k") and "ungated" in lines[1] and "drain 18.0 ms" in lines[1]
    assert "awake     0.900 [0.900-0.900] n=3" in lines[2] and "drain 0.8 ms" in lines[2]
    old = [{k: v for k, v in t.items() if k not in ("drain_s", "loop_cpu")} for t in turns]
    overhead.print_table(old, ["k"], ())
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split() for row in rows] == [["k", "awake", "0.900", "[0.900-0.900]", "n=3"]]


def test_each_awake_variant_is_weighed_against_awake_round_by_round(capsys) -> None:
    """The rounds' drift cancels out of a pair measured in one round: under each variant's row,
    ``awake`` over it per round, and the rounds ``awake`` was ahead in."""
    overhead = load_script("benchmarks/driver_gate/overhead.py")
    speeds = [(100, 90, 80), (50, 48, 44), (80, 60, 66)]  # ungated, awake, the variant
    turns = [
        {"kind": "k", "config": c, "turn": f"{r}:1", "steps": steps, "s": 1.0}
        for r, row in enumerate(speeds)
        for c, steps in zip(("ungated", "awake", "awake:V=0"), row, strict=True)
    ]
    overhead.print_table(turns, ["k"], ("V=0",))
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.split() == [
        "awake", "over", "it,", "round", "by", "round:", "1.091", "[0.909-1.125],", "ahead",
        "in", "2", "of", "3",
    ]  # fmt: skip
    assert overhead.against_awake(turns, "k", "awake:W=1") == ""
