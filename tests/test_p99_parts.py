"""benchmarks/driver_gate/p99_parts.py: a gated run's requests replayed with their service
times taken from the gated run or from the alone run of the same arrivals."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT, load_script

SCRIPT = "benchmarks/driver_gate/p99_parts.py"


def _load() -> ModuleType:
    return load_script(SCRIPT)


def test_a_request_that_finds_the_server_idle_pays_the_switch_once() -> None:
    latencies = _load().replay([0.0, 0.5, 5.0], [1.0, 1.0, 1.0], switch=0.2)
    assert latencies == pytest.approx([1.2, 1.7, 1.2])  # the second queued: no switch
    assert _load().replay([0.0, 0.5, 5.0], [1.0, 1.0, 1.0]) == pytest.approx([1.0, 1.5, 1.0])


def _server(arrivals: list[float], services: list[float]) -> dict[str, list[float]]:
    """What a server that serves in order records (unix seconds), services in ms."""
    start, end, free = [], [], 0.0
    for a, s in zip(arrivals, services, strict=True):
        start.append(max(a, free))
        free = start[-1] + s / 1e3
        end.append(free)
    return {"scheduled": arrivals, "start": start, "end": end}


# bursts of three requests 0.5 ms apart, 10 ms between bursts
ARRIVALS = [100.0 + 0.01 * b + 0.0005 * k for b in range(40) for k in range(3)]


def test_the_parts_tell_the_idle_starts_from_the_queued_requests() -> None:
    alone = _server(ARRIVALS, [1.0] * len(ARRIVALS))
    first = [k == 0 for _ in range(40) for k in range(3)]  # each burst's first finds it idle
    gated = _server(ARRIVALS, [1.3 if f else 1.0 for f in first])
    r = _load().parts(gated, alone, switch_ms=0.3)
    assert r["found_idle"] == 40
    assert r["alone"]["p99_ms"] == pytest.approx(2.0)  # the third of a burst: 1 + 1 - 2 x 0.5
    assert r["gated"]["p99_ms"] == pytest.approx(2.3) == r["measured_p99_ms"]
    assert r["idle gated"]["p99_ms"] == pytest.approx(2.3)  # the idle starts make all of it
    assert r["queued gated"]["of_alone"] == pytest.approx(1.0)
    assert r["alone + switch"]["p99_ms"] == pytest.approx(2.3)


def test_a_slower_server_while_the_trainer_is_held_shows_in_the_queued_part() -> None:
    alone = _server(ARRIVALS, [1.0] * len(ARRIVALS))
    gated = _server(ARRIVALS, [1.0 if k == 0 else 1.2 for _ in range(40) for k in range(3)])
    r = _load().parts(gated, alone, switch_ms=0.0)
    assert r["queued gated"]["p99_ms"] == pytest.approx(r["gated"]["p99_ms"])
    assert r["queued gated"]["of_alone"] > 1.1 and r["idle gated"]["of_alone"] == pytest.approx(1)


def test_the_alone_run_is_found_beside_a_kept_run_or_a_benchs_own() -> None:
    alone_folder = _load().alone_folder
    assert alone_folder(Path("cell/r2-gpreempt-no-request")) == Path("cell/r2-a-alone")
    assert alone_folder(Path("out/runs/r0/gpreempt")) == Path("out/runs/r0/a-alone")


def _write(folder: Path, server: dict[str, list[float]]) -> None:
    folder.mkdir(parents=True)
    (folder / "case-a.json.gz").write_bytes(gzip.compress(json.dumps(server).encode()))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(ROOT / SCRIPT), *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=60)  # fmt: skip


def test_the_command_reads_gzipped_runs_and_names_a_missing_alone_run(tmp_path: Path) -> None:
    _write(tmp_path / "r0-gpreempt", _server(ARRIVALS, [1.1] * len(ARRIVALS)))
    missing = _cli(str(tmp_path / "r0-gpreempt"))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "no alone run" in missing.stderr and "--alone" in missing.stderr
    _write(tmp_path / "r0-a-alone", _server(ARRIVALS, [1.0] * len(ARRIVALS)))
    done = _cli("--json", str(tmp_path / "r0-gpreempt"))
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)[str(tmp_path / "r0-gpreempt")]
    assert r["gated"]["of_alone"] > 1.0 and r["switch_ms"] == pytest.approx(0.134)


def test_a_slower_server_alone_shows_how_much_its_p99_moves() -> None:
    alone = _server(ARRIVALS, [1.0] * len(ARRIVALS))
    r = _load().parts(alone, alone, switch_ms=0.0, scale=1.1)
    # the third of a burst waits longest: 3 x 1.1 - 2 x 0.5
    assert r["alone x 1.1"]["p99_ms"] == pytest.approx(2.3)
    assert "alone x 1.1" not in _load().parts(alone, alone, switch_ms=0.0)


def test_a_scale_of_zero_is_refused_in_one_line(tmp_path: Path) -> None:
    _write(tmp_path / "r0-gpreempt", _server(ARRIVALS, [1.0] * len(ARRIVALS)))
    _write(tmp_path / "r0-a-alone", _server(ARRIVALS, [1.0] * len(ARRIVALS)))
    refused = _cli("--scale", "0", str(tmp_path / "r0-gpreempt"))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "--scale must be more than 0" in refused.stderr
    shown = _cli("--scale", "1.01", str(tmp_path / "r0-gpreempt"))
    assert shown.returncode == 0 and "alone x 1.01" in shown.stdout
