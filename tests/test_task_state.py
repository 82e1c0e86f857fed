"""A task's state changes only through change_state, and only along allowed transitions."""

from __future__ import annotations

import os

import pytest

from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.daemon.task_state import STOPPED, TRANSITIONS, StateError, TaskState, change_state


def task() -> Task:
    return Task(TaskIdentity(1, 4242, None, 0, os.getuid(), "trainer", -100, (0,), "auto"))


def test_a_preemption_and_its_turns_keep_their_times() -> None:
    t = task()
    assert t.state is TaskState.RUNNING and not t.suspended
    change_state(t, TaskState.SUSPENDED, now=10.0, mechanism="gate")
    assert t.suspended and t.suspended_with == "gate"
    assert t.suspended_since == 10.0 and t.preempted_since == 10.0
    change_state(t, TaskState.WAITING_TURN, now=11.0)  # only a peer's turn left
    assert t.waiting_turn and t.preempted_since is None and t.suspended_since == 10.0
    change_state(t, TaskState.SUSPENDED, now=12.0)  # a more important task again
    assert t.preempted_since == 12.0 and t.suspended_since == 10.0
    change_state(t, TaskState.RUNNING, now=13.0)
    assert not t.suspended and t.suspended_since is None and t.preempted_since is None
    assert t.suspended_with == "gate"  # the last mechanism, for status


def test_a_failed_suspension_is_unprotected_until_it_succeeds_or_is_not_wanted() -> None:
    t = task()
    change_state(t, TaskState.UNPROTECTED, now=1.0, error="suspend failed: no gate")
    assert t.status_word == "unprotected" and t.suspend_error == "suspend failed: no gate"
    change_state(t, TaskState.UNPROTECTED, now=2.0, error="suspend failed: gone")  # new reason
    change_state(t, TaskState.SUSPENDED, now=3.0, mechanism="signal")
    assert t.suspend_error is None and t.status_word == "suspended"
    with pytest.raises(StateError, match="only with a reason"):
        change_state(task(), TaskState.UNPROTECTED, now=1.0)


def test_eviction_stops_a_running_task_and_a_restore_leaves_it_suspended() -> None:
    t = task()
    change_state(t, TaskState.EVICTED, now=5.0, mechanism="lock")
    assert t.evicted and t.suspended and t.suspended_with == "lock"
    assert t.status_word == "evicted"
    change_state(t, TaskState.SUSPENDED, now=6.0)
    assert not t.evicted and t.suspended and t.suspended_since == 5.0


@pytest.mark.parametrize(
    ("start", "refused"),
    [
        (TaskState.RUNNING, TaskState.RUNNING),  # resuming what runs
        (TaskState.SUSPENDED, TaskState.UNPROTECTED),  # a failure for what is stopped
        (TaskState.SUSPENDED, TaskState.SUSPENDED),
        (TaskState.EVICTED, TaskState.WAITING_TURN),  # its memory must come back first
        (TaskState.EVICTED, TaskState.EVICTED),  # evicted twice
    ],
)
def test_a_transition_the_daemon_never_makes_is_refused(start, refused) -> None:
    t = task()
    if start is not TaskState.RUNNING:
        change_state(t, start, now=1.0, mechanism="signal")
    with pytest.raises(StateError, match=f"cannot go from {start.value} to {refused.value}"):
        change_state(t, refused, now=2.0, mechanism="signal")
    assert t.state is start  # unchanged


def test_entering_a_stopped_state_needs_a_mechanism() -> None:
    with pytest.raises(StateError, match="by a mechanism"):
        change_state(task(), TaskState.SUSPENDED, now=1.0)


def test_every_state_has_its_transitions_and_every_stopped_state_can_resume() -> None:
    assert set(TRANSITIONS) == set(TaskState)
    for state in STOPPED:
        assert TaskState.RUNNING in TRANSITIONS[state]
