"""The daemon's side of a degraded suspension: a mechanism that held less than it promises (kfd
that suspended none of the task's GPU queues) gives an event ``degraded``, the task's counter
and a failure in the metrics, and the task counts as suspended by what held it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpreempt.daemon.apply import Executor
from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.daemon.task_state import TaskState
from gpreempt.mechanisms.base import Mechanism, Target


class HeldBySignal(Mechanism):
    """Stands in for kfd whose tracer held none of the task's queues."""

    name = "kfd"

    def check(self, target: Target) -> None:
        pass

    def suspend(self, target: Target) -> str:
        self.note = "kfd suspended none of the task's 2 GPU queues"
        return "signal"

    def resume(self, target: Target) -> str:
        return "signal"

    def take_degradation(self, target: Target) -> str | None:
        note, self.note = getattr(self, "note", None), None
        return note


@dataclass
class Events:
    lines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def write(self, kind: str, **fields: Any) -> None:
        self.lines.append((kind, fields))


class Metrics:
    def __init__(self) -> None:
        self.failed: list[tuple[int, str, str]] = []
        self.suspends: list[str] = []

    def on_suspend_failed(self, gpu: int, task: str, mechanism: str) -> None:
        self.failed.append((gpu, task, mechanism))

    def on_suspend(self, gpu: int, task: str, mechanism: str, seconds: float) -> None:
        self.suspends.append(mechanism)


class Mechanisms:
    def __init__(self, mechanism: Mechanism) -> None:
        self.mechanism = mechanism

    def get(self, name: str) -> Mechanism:
        return self.mechanism


class Host:
    def __init__(self, mechanism: Mechanism) -> None:
        self.mechanisms = Mechanisms(mechanism)
        self.events = Events()
        self.metrics = Metrics()
        self.logged: list[str] = []

    def log(self, line: str) -> None:
        self.logged.append(line)

    def record_stops(self, about_to: dict[int, str]) -> bool:
        return True  # the stop is recorded before it is made (persist.py)

    def state_files_error(self) -> str | None:
        return None


def test_a_degraded_suspension_is_an_event_and_a_counter() -> None:
    host = Host(HeldBySignal())
    task = Task(TaskIdentity(1, 4242, None, 0, 0, "trainer", 10, (0,), "kfd"))
    executor = Executor(host)  # type: ignore[arg-type]
    assert executor.suspend(task, now=0.0)
    assert task.state is TaskState.SUSPENDED and task.suspended_with == "signal"
    assert task.counters.degradations == 1
    kinds = [kind for kind, _ in host.events.lines]
    assert kinds == ["degraded", "suspend"]
    _, degraded = host.events.lines[0]
    assert degraded["mechanism"] == "kfd" and degraded["used"] == "signal"
    assert "none of the task's 2 GPU queues" in degraded["reason"]
    assert host.metrics.failed == [(0, "trainer", "kfd")]
    assert host.metrics.suspends == ["signal"]
    assert task.describe(now=1.0)["degradations"] == 1  # gpreempt status shows it
