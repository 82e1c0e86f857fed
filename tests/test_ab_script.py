"""benchmarks/driver_gate/ab.sh, on the CPU: each variant's copy of the tree changed by its
command, the variants interleaved round by round in alternating order, and each variant's
rounds combined (ab_merge.py) and printed by the defaults' table. run.sh is a stub that
records its runs and writes a cell whose P99 ratio the variant's command chose."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

STUB_RUN = r"""#!/usr/bin/env bash
# stub of run.sh: one cell, its P99 ratio read from the copy's VALUE file
echo "$(basename "$PWD") $1 REPEATS=$REPEATS" >> "$AB_LOG"
mkdir -p "$OUT/compiled"
python3 - "$OUT/compiled/results.json" "$(cat VALUE)" <<'PY'
import json, sys
scenario = {"a_p99_ratio": float(sys.argv[2]), "b_kept": 0.4, "valid": True, "spread": {}}
params = {"case_a": "light", "load": 0.5, "bg": 1, "case_b": "stub", "repeats": 1}
json.dump({"params": params, "scenarios": {"gpreempt": scenario}}, open(sys.argv[1], "w"))
PY
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tree with ab.sh, its table and deadline.sh, and the stub run.sh."""
    root = tmp_path / "tree"
    (root / "benchmarks/driver_gate").mkdir(parents=True)
    (root / "benchmarks/defaults").mkdir()
    shutil.copy(ROOT / "benchmarks/deadline.sh", root / "benchmarks")
    shutil.copy(ROOT / "benchmarks/defaults/table.py", root / "benchmarks/defaults")
    for name in ("ab.sh", "ab_merge.py"):
        shutil.copy(ROOT / "benchmarks/driver_gate" / name, root / "benchmarks/driver_gate")
    (root / "benchmarks/driver_gate/run.sh").write_text(STUB_RUN)
    (root / "VALUE").write_text("1.0")
    return root


def _ab(tree: Path, tmp_path: Path, *variants: str, rounds: int = 3, first: int = 0):
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT / "src"),
        "OUT": str(tmp_path / "out"),
        "ROUNDS": str(rounds),
        "FIRST_ROUND": str(first),
        "AB_WORK": str(tmp_path / "copies"),
        "AB_LOG": str(tmp_path / "runs.log"),
    }
    return subprocess.run(
        ["bash", "benchmarks/driver_gate/ab.sh", "compiled", *variants],
        cwd=tree, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _cells(table: str) -> dict[str, list[str]]:
    """The defaults' table as printed: each cell's lines by its name (its header first)."""
    cells: dict[str, list[str]] = {}
    for line in table.splitlines():
        if ": Case-A " in line:
            name = line.split(":")[0].rsplit("/", 1)[-1]
            cells[name] = []
        if cells:
            cells[name].append(line)
    return cells


def test_variants_run_interleaved_each_in_its_changed_copy(tree: Path, tmp_path: Path) -> None:
    done = _ab(tree, tmp_path, "now=:", "slower=echo 1.2 > VALUE")
    assert done.returncode == 0, done.stderr
    runs = (tmp_path / "runs.log").read_text().split("\n")
    order = [line.split()[0] for line in runs if line]
    assert order == ["now", "slower", "slower", "now", "now", "slower"]
    assert all(line.endswith("compiled REPEATS=1") for line in runs if line)
    results = tmp_path / "out/slower/r2/compiled/results.json"
    assert json.loads(results.read_text())["scenarios"]["gpreempt"]["a_p99_ratio"] == 1.2
    assert (tree / "VALUE").read_text() == "1.0"  # the tree itself is left as it was
    table = _cells(done.stdout)
    assert "3 repeat(s)" in table["slower"][0]
    assert "P99 ratio 1.20 [1.20-1.20]" in table["slower"][1]
    assert "P99 ratio 1.00 [1.00-1.00]" in table["now"][1]


def test_a_bad_variant_is_one_line_and_nothing_runs(tree: Path, tmp_path: Path) -> None:
    bad_name = _ab(tree, tmp_path, "now=:", "no good=:")
    assert bad_name.returncode == 2
    assert bad_name.stderr.strip().splitlines() == [
        "ab: bad variant name 'no good' (letters, digits, . _ -)"
    ]
    failing = _ab(tree, tmp_path, "now=:", "broken=false")
    assert failing.returncode == 1
    assert "the command of variant broken failed" in failing.stderr
    too_few = _ab(tree, tmp_path, "now=:")
    assert too_few.returncode == 2 and "usage" in too_few.stderr
    assert not (tmp_path / "runs.log").exists()


def test_a_run_split_over_calls_numbers_its_rounds_on(tree: Path, tmp_path: Path) -> None:
    """The second call's rounds follow the first's (r1, r2) and go on alternating."""
    assert _ab(tree, tmp_path, "now=:", "b=:", rounds=1).returncode == 0
    done = _ab(tree, tmp_path, "now=:", "b=:", rounds=2, first=1)
    assert done.returncode == 0, done.stderr
    order = [line.split()[0] for line in (tmp_path / "runs.log").read_text().splitlines()]
    assert order == ["now", "b", "b", "now", "now", "b"]
    assert sorted(p.name for p in (tmp_path / "out/b").glob("r[0-9]*")) == ["r0", "r1", "r2"]
    assert all("3 repeat(s)" in lines[0] for lines in _cells(done.stdout).values())
