"""A change of a task's state is told where it is made: StateLog writes its event and its
metric, and no other module of the daemon changes a state or writes those events."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import pytest

from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.daemon.task_state import StateLog, TaskState

DAEMON_DIR = Path(__file__).resolve().parent.parent / "src" / "gpreempt" / "daemon"
#: The events that tell a change of state (event_log.py), written by StateLog alone.
STATE_EVENTS = {"suspend", "resume", "evict", "restore"}
#: Writes of those events that tell no change of a task's state, with why.
NOT_A_CHANGE = {
    ("server.py", "'resume'"): "a process a previous daemon left suspended: no task of this one",
    ("lifecycle.py", "'resume'"): "a process found stopped as it registers again after a restart",
}


class Events:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, event: str, **fields: Any) -> None:
        self.records.append({"event": event, **fields})


class Metrics:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *args))


def task() -> Task:
    return Task(TaskIdentity(1, 4242, None, 0, os.getuid(), "trainer", -100, (2,), "auto"))


def test_a_suspension_and_its_resume_are_each_one_event_and_one_metric() -> None:
    events, metrics, t = Events(), Metrics(), task()
    log = StateLog(events, metrics)
    log.suspended(t, turn=False, mechanism="gate", latency_ms=2.0, reason="policy", now=10.0)
    assert t.state is TaskState.SUSPENDED and t.suspended_with == "gate"
    assert events.records[-1] == {
        "event": "suspend",
        "task": "trainer",
        "task_id": 1,
        "pid": 4242,
        "gpu": 2,
        "mechanism": "gate",
        "latency_ms": 2.0,
        "reason": "policy",
    }
    assert metrics.calls[-1] == ("on_suspend", 2, "trainer", "gate", 0.002)
    suspended_for = log.resumed(t, mechanism="gate", latency_ms=1.0, reason="policy", now=12.5)
    assert suspended_for == 2.5 and t.state is TaskState.RUNNING
    assert events.records[-1]["event"] == "resume" and events.records[-1]["suspended_ms"] == 2500
    assert metrics.calls[-1] == ("on_resume", 2, "trainer", 2.5)


def test_a_turn_counts_as_a_turn() -> None:
    events, metrics, t = Events(), Metrics(), task()
    StateLog(events, metrics).suspended(
        t, turn=True, mechanism="gate", latency_ms=0.1, reason="turn", now=1.0
    )
    assert t.state is TaskState.WAITING_TURN and metrics.calls == [("on_turn", 2, "trainer")]


def test_an_eviction_and_its_restore_tell_the_bytes_moved() -> None:
    events, metrics, t = Events(), Metrics(), task()
    log = StateLog(events, metrics)
    log.evicted(t, moved=2 * 10**9, seconds=2.0, reason="test", now=1.0)
    assert t.state is TaskState.EVICTED and t.suspended_with == "lock"
    assert events.records[-1]["event"] == "evict" and events.records[-1]["gb_per_s"] == 1.0
    log.restored(t, moved=2 * 10**9, seconds=0.0, reason="test", now=2.0)
    assert t.state is TaskState.SUSPENDED and events.records[-1]["gb_per_s"] is None
    assert [c[0] for c in metrics.calls] == ["on_evict", "on_restore"]


def test_without_metrics_the_events_are_still_written() -> None:
    events, t = Events(), task()
    log = StateLog(events)
    log.unprotected(t, mechanism="signal", reason="suspend failed: gone", now=1.0)
    assert t.state is TaskState.UNPROTECTED and events.records[-1]["event"] == "error"
    log.settled(t, TaskState.RUNNING, now=2.0)  # told to nobody
    assert t.state is TaskState.RUNNING and len(events.records) == 1


def state_writers(source: str, where: str) -> list[str]:
    """Calls of change_state, assignments of a ``state``, and writes of a state's event in
    ``source``, each as ``where:line``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "change_state":
            found.append(f"{where}:{node.lineno} calls change_state")
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "state" for t in node.targets
        ):
            found.append(f"{where}:{node.lineno} sets a state")
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "write"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in STATE_EVENTS
        ):
            found.append(f"{where}:{node.lineno} writes {node.args[0].value!r}")
    return found


def test_only_task_state_changes_a_state_and_tells_it() -> None:
    found = [
        line
        for path in sorted(DAEMON_DIR.glob("*.py"))
        if path.name != "task_state.py"
        for line in state_writers(path.read_text(), path.name)
        if (path.name, line.rpartition(" ")[2]) not in NOT_A_CHANGE
    ]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "change_state(task, TaskState.RUNNING, now=now)\n",
        "task.state = TaskState.RUNNING\n",
        'self.host.events.write("resume", **task.event_fields())\n',
    ],
)
def test_the_check_finds_a_writer_of_its_own(source: str) -> None:
    assert state_writers(source, "apply.py")
