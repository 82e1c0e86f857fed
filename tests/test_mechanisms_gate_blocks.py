"""The gate mechanism acts on every control block of a task: a task may have several (each of
its processes; a driver-level gate's own channel beside a Python client's block, whose gate is
not installed where PyTorch's operator gate is off)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gpreempt.control import OFF_GATE_INSTALLED
from gpreempt.control_block import ControlBlock
from gpreempt.daemon.task import Task, gate_status
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.errors import MechanismUnavailable
from gpreempt.mechanisms.base import Target
from gpreempt.mechanisms.launch_gate import GateMechanism


@pytest.fixture
def blocks() -> Iterator[list[ControlBlock]]:
    made = [ControlBlock.create(), ControlBlock.create()]
    made[1]._set32(OFF_GATE_INSTALLED, 1)  # as a driver-level gate's own channel does
    yield made
    for block in made:
        block.close()


def test_every_block_of_the_task_is_closed_and_opened(blocks: list[ControlBlock]) -> None:
    gate = GateMechanism()
    target = Target(pid=1, control=blocks[1], controls=tuple(blocks))
    gate.suspend(target)
    assert all(b.gate_closed for b in blocks)
    gate.resume(target)
    assert not any(b.gate_closed for b in blocks)


def test_a_task_with_no_installed_gate_is_refused(blocks: list[ControlBlock]) -> None:
    with pytest.raises(MechanismUnavailable, match="not installed"):
        GateMechanism().suspend(Target(pid=1, control=blocks[0], controls=(blocks[0],)))


def test_a_task_is_judged_and_shown_by_its_installed_gate(blocks: list[ControlBlock]) -> None:
    task = Task(TaskIdentity(1, 4242, None, 0, os.getuid(), "trainer", -100, (0,), "auto"))
    task.controls = {7: blocks[0], 8: blocks[1]}  # a client's block first, then the channel's
    assert task.target().control is blocks[1]
    assert task.target().controls == (blocks[0], blocks[1])
    status = gate_status(task)
    assert status is not None and status["installed"]
