"""Processes taking turns (gpreempt.bench.turns), with real processes and a real daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpreempt.bench import turns

#: A process that, when its id has the turn, appends one line naming the turn.
TAKER = r"""
import sys
from pathlib import Path
from gpreempt.bench import turns
turn, me, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
turns.take_turns(turn, me, out, lambda key: {"me": me})
"""


def test_the_environment_is_a_plain_processs(monkeypatch) -> None:
    monkeypatch.setenv("GPREEMPT_GATE", "0")
    monkeypatch.setenv("GPREEMPT_CACHE_DIR", "/somewhere")
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/lib.so")
    env = turns.clean_env()
    assert "GPREEMPT_GATE" not in env and "CUDA_INJECTION64_PATH" not in env
    assert env["GPREEMPT_CACHE_DIR"] == "/somewhere" and env["PYTHONUNBUFFERED"] == "1"


def test_lines_half_written_read_as_none_yet(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert turns.read_lines(out) == []
    out.write_text('{"turn": "0:1"}\n{"tur')
    assert turns.read_lines(out) == []
    out.write_text('{"turn": "0:1"}\n')
    assert turns.read_lines(out) == [{"turn": "0:1"}]


def test_processes_take_their_turns_and_stop(tmp_path: Path) -> None:
    turn = tmp_path / "turn"
    turn.write_text("")
    outs = {who: tmp_path / f"{who}.jsonl" for who in ("a", "b")}
    procs = [
        subprocess.Popen([sys.executable, "-c", TAKER, str(turn), who, str(out)])
        for who, out in outs.items()
    ]
    try:
        turns.wait_started(list(outs.values()), procs)
        for key in ("0:1", "1:1"):
            for who in ("b", "a"):
                turns.give_turn(turn, who, key, outs[who], timeout_s=20)
        with pytest.raises(RuntimeError, match="did not finish"):
            turns.give_turn(turn, "nobody", "2:1", outs["a"], timeout_s=0.2)
    finally:
        turns.stop_all(turn, procs)
    assert all(p.returncode is not None for p in procs)
    assert [x["turn"] for x in turns.read_lines(outs["a"])] == ["0:1", "1:1"]


def test_a_private_daemon_serves_a_run(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    daemon = turns.start_daemon(runtime, turns.clean_env())
    try:
        assert (runtime / "gpreempt.sock").exists()
        reply = subprocess.run(
            [*turns.run_under(runtime), "--priority", "low", "--", sys.executable, "-c", "0"],
            env=turns.clean_env(),
            capture_output=True,
            timeout=60,
        )
        assert reply.returncode == 0, reply.stderr
    finally:
        daemon.terminate()
        daemon.wait(20)
