"""The ``gate`` mechanism, daemon side: close or open a task's in-process launch gate.

Closing is one store into each of the task's control blocks (one per process, and a
driver-level gate's own channel beside a Python client's); the gate in each process sees it
before its next launch and lets only the bounded work already in flight drain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import MechanismUnavailable
from ..names import MechanismName
from .base import Mechanism, Target

if TYPE_CHECKING:
    from ..control_block import ControlBlock


class GateMechanism(Mechanism):
    name = MechanismName.GATE
    closes_gate = True
    in_process = True

    def check(self, target: Target) -> None:
        if target.control is None:
            raise MechanismUnavailable(
                f"process {target.pid} has not connected its in-process client to the daemon, "
                "so it has no launch gate: under `gpreempt run` a Python process connects when "
                "it imports PyTorch (it has not yet, it is not Python, or its client failed: "
                "see its stderr); elsewhere call gpreempt.attach(). Use --mechanism auto or "
                "signal for other programs"
            )
        if not target.control.gate_installed:
            raise MechanismUnavailable(
                f"process {target.pid} is connected but its launch gate is not installed "
                "(GPREEMPT_GATE=0, or installing it failed: see the process's stderr for "
                "'gpreempt: launch gate not installed')"
            )

    def suspend(self, target: Target) -> str:
        self.check(target)
        for control in _blocks(target):
            control.set_gate(True)
        return self.name

    def resume(self, target: Target) -> str:
        for control in _blocks(target):
            control.set_gate(False)
        return self.name


def _blocks(target: Target) -> tuple[ControlBlock, ...]:
    """Every block of the task (each of its processes, a driver-level gate's own channel),
    or its one block."""
    if target.controls:
        return target.controls
    return (target.control,) if target.control is not None else ()
