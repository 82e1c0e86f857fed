"""A new daemon undoes what the previous one left: each recorded process's mechanism undoes
its own leftovers, then the process is continued (persist.resume_leftovers)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpreempt.daemon import persist
from gpreempt.mechanisms import KINDS, Mechanism
from gpreempt.mechanisms.base import Target
from gpreempt.names import MechanismName
from gpreempt.procinfo import read_process


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def _record(proc: subprocess.Popen[bytes], mechanism: str) -> persist.SuspendedRecord:
    start_time = read_process(proc.pid).start_time
    return persist.SuspendedRecord(proc.pid, None, start_time, mechanism, "trainer")


@pytest.mark.parametrize(
    ("recorded", "undoes"),
    [
        (MechanismName.LOCK, MechanismName.LOCK),
        (MechanismName.KFD, MechanismName.KFD),
        (MechanismName.SIGNAL, MechanismName.SIGNAL),
        (persist.EVICTED, MechanismName.LOCK),  # held by the driver lock, memory on the host
    ],
)
def test_each_mechanism_undoes_its_own_leftovers(
    tmp_path: Path, sleeper, monkeypatch, recorded: str, undoes: str
) -> None:
    asked: list[tuple[str, int]] = []
    for name, cls in KINDS.items():

        def undo(target: Target, name: str = name) -> None:
            asked.append((name, target.pid))

        monkeypatch.setattr(cls, "undo_leftovers", staticmethod(undo))
    path = tmp_path / "state.json"
    persist.save(path, [_record(sleeper, recorded)])
    outcomes = persist.resume_leftovers(path)
    assert [outcome for _r, outcome in outcomes] == ["resumed"]
    assert asked == [(undoes, sleeper.pid)]
    assert persist.load(path) == []


def test_by_default_a_mechanism_leaves_nothing_to_undo() -> None:
    assert Mechanism.undo_leftovers(Target(pid=1)) is None
    for name in (MechanismName.GATE, MechanismName.SIGNAL, MechanismName.AUTO):
        assert KINDS[name].undo_leftovers.__func__ is Mechanism.undo_leftovers.__func__
