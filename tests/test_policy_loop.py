"""The scheduling loop's pass (policy/loop.py): run time, memory, whom to suspend and resume;
and the rule that every scheduler runs this one pass instead of a loop of its own."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from gpreempt.policy import Decision, Snapshot, TaskView, decide_hpf
from gpreempt.policy.loop import LoopState, credit_run_time, run_pass

SRC_DIR = Path(__file__).resolve().parent.parent / "src"
#: The schedulers: the daemon, the in-process scheduler and the simulator.
HOSTS = (
    "gpreempt/daemon/reconcile.py",
    "gpreempt/client/scheduler.py",
    "gpreempt/policy/simulate.py",
)
LOOP = "gpreempt/policy/loop.py"
#: What a policy is called by, where it is held (``self.policy``, ``self._policy``, ``decide``).
POLICY_HOLDERS = {"policy", "_policy", "decide"}


def view(task_id: int, priority: int = 0, **fields: Any) -> TaskView:
    fields.setdefault("active", True)
    return TaskView(task_id=task_id, priority=priority, gpus=(0,), **fields)


def suspend_nothing(snapshot: Snapshot, memory: Any) -> Decision:
    return Decision(suspend=frozenset())


def test_a_more_important_active_task_suspends_and_then_resumes_the_other() -> None:
    step = run_pass(decide_hpf, LoopState(), Snapshot(0.0, (view(1, 100), view(2, -100))))
    assert step.suspend == {2} and step.resume == frozenset()
    idle = Snapshot(1.0, (view(1, 100, active=False), view(2, -100, suspended=True)))
    step = run_pass(decide_hpf, step.state, idle)
    assert step.suspend == frozenset() and step.resume == {2}


def test_run_time_is_credited_to_tasks_active_at_the_last_pass_and_not_suspended_now() -> None:
    first = run_pass(suspend_nothing, LoopState(), Snapshot(10.0, (view(1), view(2), view(3))))
    assert first.run_seconds() == {1: 0.0, 2: 0.0, 3: 0.0}  # nothing before the first pass
    later = Snapshot(
        12.5,
        (
            view(1, run_seconds=1.0),  # ran the whole 2.5 s
            view(2, suspended=True),  # suspended since: no credit
            view(3, active=False),  # went idle now: it was active since the last pass
            view(4),  # new since the last pass: nothing yet
        ),
    )
    assert run_pass(suspend_nothing, first.state, later).run_seconds() == {
        1: 3.5,
        2: 0.0,
        3: 2.5,
        4: 0.0,
    }


def test_the_policy_sees_the_credited_time_and_gets_its_memory_back() -> None:
    seen: list[tuple[float, Any]] = []

    def remember(snapshot: Snapshot, memory: Any) -> Decision:
        seen.append((snapshot.tasks[0].run_seconds, memory))
        return Decision(suspend=frozenset(), memory=(memory or 0) + 1)

    state = LoopState()
    for now in (0.0, 1.0, 3.0):
        state = run_pass(remember, state, Snapshot(now, (view(1, run_seconds=0.0),))).state
    assert seen == [(0.0, None), (1.0, 1), (2.0, 2)]  # each pass from the last total (0 here)


def test_held_tasks_stay_suspended_whatever_the_policy_says() -> None:
    step = run_pass(suspend_nothing, LoopState(), Snapshot(0.0, (view(1, held=True),)))
    assert step.suspend == {1}
    held = Snapshot(1.0, (view(1, held=True, suspended=True),))
    assert run_pass(suspend_nothing, step.state, held).resume == frozenset()


def test_crediting_needs_a_previous_pass_and_never_goes_back() -> None:
    snapshot = Snapshot(5.0, (view(1, run_seconds=2.0),))
    assert credit_run_time(LoopState(), snapshot) is snapshot
    earlier = LoopState(at=6.0, active=frozenset({1}))
    assert credit_run_time(earlier, snapshot).tasks[0].run_seconds == 2.0


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def policy_calls_outside_the_loop(sources: dict[str, str]) -> list[str]:
    """Each call of a held policy outside the loop's pass, as ``path:line``."""
    return [
        f"{path}:{call.lineno}"
        for path, text in sources.items()
        if path != LOOP
        for call in _calls(ast.parse(text))
        if _callee(call) in POLICY_HOLDERS
    ]


def test_every_scheduler_runs_the_one_pass() -> None:
    for host in HOSTS:
        tree = ast.parse((SRC_DIR / host).read_text())
        assert "run_pass" in {_callee(c) for c in _calls(tree)}, f"{host} does not call run_pass"


def test_no_scheduler_asks_a_policy_itself() -> None:
    sources = {str(p.relative_to(SRC_DIR)): p.read_text() for p in SRC_DIR.rglob("*.py")}
    assert policy_calls_outside_the_loop(sources) == []


@pytest.mark.parametrize(
    "source",
    [
        "decision = self.policy(snapshot, self.memory)\n",
        "decision = self._policy(snapshot, None)\n",
        "decision = built.decide(snapshot, None)\n",
    ],
)
def test_the_check_finds_a_loop_of_its_own(source: str) -> None:
    assert policy_calls_outside_the_loop({"gpreempt/daemon/reconcile.py": source})
