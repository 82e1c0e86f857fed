"""Which tasks a gate watches directly: a pure function of the snapshot."""

from __future__ import annotations

from gpreempt.policy.hpf import decide_hpf
from gpreempt.policy.snapshot import Snapshot, TaskView
from gpreempt.policy.watch import watch_lists


def _task(task_id: int, priority: int, gpus=(0,), held=False, active=False) -> TaskView:
    return TaskView(task_id=task_id, priority=priority, gpus=gpus, active=active, held=held)


def test_each_task_watches_the_more_important_tasks_of_its_gpus() -> None:
    snapshot = Snapshot(
        now=0.0,
        tasks=(
            _task(1, 100),
            _task(2, 0),
            _task(3, -100),
            _task(4, -100),  # equal priorities never stop each other
            _task(5, 50, gpus=(1,)),  # another GPU
            _task(6, -100, gpus=(0, 1)),  # both GPUs: the union
        ),
    )
    assert watch_lists(snapshot) == {
        2: frozenset({1}),
        3: frozenset({1, 2}),
        4: frozenset({1, 2}),
        6: frozenset({1, 2, 5}),
    }


def test_held_tasks_are_not_watched_and_nothing_outranks_the_top() -> None:
    snapshot = Snapshot(now=0.0, tasks=(_task(1, 100, held=True), _task(2, 0), _task(3, -5)))
    assert watch_lists(snapshot) == {3: frozenset({2})}
    assert watch_lists(Snapshot(now=0.0, tasks=(_task(1, 0),))) == {}


def test_a_watched_task_becoming_active_is_exactly_when_hpf_suspends() -> None:
    """The watch never stops a task that hpf would leave running."""
    tasks = [_task(1, 100), _task(2, 0), _task(3, -100), _task(4, 10, gpus=(1,)), _task(5, 0)]
    for active in range(1, 6):
        views = tuple(
            TaskView(t.task_id, t.priority, t.gpus, active=t.task_id == active) for t in tasks
        )
        snapshot = Snapshot(now=0.0, tasks=views)
        stopped_by_watch = {
            low for low, higher in watch_lists(snapshot).items() if active in higher
        }
        assert stopped_by_watch == set(decide_hpf(snapshot).suspend)
