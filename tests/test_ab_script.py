"""benchmarks/driver_gate/ab.sh, on the CPU: each variant's copy of the tree changed by its
command, the variants interleaved round by round in alternating order, and ab_table.py's
medians over the rounds. run.sh is a stub that records its runs and writes a cell whose P99
ratio the variant's command chose."""

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
scenario = {"a_p99_ratio": float(sys.argv[2]), "b_kept": 0.4, "a_service_ms": {"mean": 1.4}}
json.dump({"scenarios": {"gpreempt": scenario}}, open(sys.argv[1], "w"))
PY
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tree with ab.sh, its table and deadline.sh, and the stub run.sh."""
    root = tmp_path / "tree"
    (root / "benchmarks/driver_gate").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks/deadline.sh", root / "benchmarks")
    for name in ("ab.sh", "ab_table.py"):
        shutil.copy(ROOT / "benchmarks/driver_gate" / name, root / "benchmarks/driver_gate")
    (root / "benchmarks/driver_gate/run.sh").write_text(STUB_RUN)
    (root / "VALUE").write_text("1.0")
    return root


def _ab(tree: Path, tmp_path: Path, *variants: str, rounds: int = 3, first: int = 0):
    env = {
        "PATH": os.environ["PATH"],
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
    table = {line.split()[0]: line for line in done.stdout.splitlines() if "gpreempt" in line}
    assert "1.200 [1.200-1.200]" in table["slower"] and table["slower"].endswith("n=3")
    assert "1.000 [1.000-1.000]" in table["now"]


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
    assert sorted(p.name for p in (tmp_path / "out/b").iterdir()) == ["r0", "r1", "r2"]
    assert any(line.endswith("n=3") for line in done.stdout.splitlines())
