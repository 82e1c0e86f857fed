"""What a task registers with is one type, :class:`~gpreempt.messages.TaskFields`, and it parses
the task's priority and mechanism itself: whoever builds it (the wire, ``gpreempt run`` and
``attach``, ``gpreempt.attach()``, ``DaemonClient.register``) gets the same int, the same
:class:`~gpreempt.names.MechanismName` and the same clear error, and no caller parses them
again before or after."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from gpreempt.cli._task_options import add_mechanism_option, add_task_options, task_fields
from gpreempt.errors import PriorityError, UsageError
from gpreempt.messages import RegisterRequest, TaskFields
from gpreempt.names import MechanismName

SRC_DIR = Path(__file__).resolve().parent.parent / "src"

#: The modules that call ``parse_priority``, and what each parses: a task's priority only in
#: TaskFields.
PARSERS = {
    "gpreempt/messages.py": "a task's priority, in TaskFields",
    "gpreempt/daemon/limits.py": "the highest priority of a user, in the limits file",
    "gpreempt/cli/serve.py": "--max-user-priority",
    "gpreempt/client/scheduler.py": "a thread's priority in the in-process scheduler",
}


def test_a_priority_name_and_a_mechanism_name_become_their_values() -> None:
    fields = TaskFields(priority="high", mechanism="gate")
    assert fields.priority == 100 and fields.mechanism is MechanismName.GATE
    assert TaskFields(priority=" low ").priority == -100
    assert TaskFields().mechanism is MechanismName.AUTO


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"priority": "urgent"}, PriorityError, "unknown priority 'urgent'"),
        ({"priority": 300}, PriorityError, "out of range"),
        ({"priority": True}, PriorityError, "a name or an integer"),
        ({"mechanism": "lok"}, UsageError, "unknown mechanism 'lok': choose one of auto"),
    ],
)
def test_a_bad_priority_or_mechanism_is_one_clear_usage_error(fields, error, match) -> None:
    with pytest.raises(error, match=match):
        TaskFields(**fields)
    with pytest.raises(error, match=match):  # read from the wire, the same
        RegisterRequest.from_wire({"pid": 1, **fields})


def test_the_command_line_builds_the_fields_it_registers() -> None:
    parser = argparse.ArgumentParser()
    add_task_options(parser)
    add_mechanism_option(parser)
    args = parser.parse_args(["-p", "low", "--gpu", "1", "-m", "signal", "--name", "t"])
    fields = task_fields(args, reserve_bytes=1024)
    assert fields == TaskFields(
        name="t", priority=-100, gpus=(1,), mechanism="signal", reserve_bytes=1024
    )
    with pytest.raises(PriorityError):
        task_fields(parser.parse_args(["-p", "urgent"]))


def test_only_task_fields_parse_a_tasks_priority() -> None:
    callers = {
        str(path.relative_to(SRC_DIR))
        for path in SRC_DIR.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "parse_priority"
    }
    assert callers == set(PARSERS), "a task's priority is parsed by TaskFields alone"
