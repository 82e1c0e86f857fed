"""The ``gate`` mechanism, daemon side: close or open a task's in-process launch gate.

Closing is one store into the task's control block; the gate in the task's process sees it
before its next launch and lets only the bounded work already in flight drain.
"""

from __future__ import annotations

from ..errors import MechanismUnavailable
from ..names import MechanismName
from .base import Mechanism, Target


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
        assert target.control is not None
        target.control.set_gate(True)
        return self.name

    def resume(self, target: Target) -> str:
        if target.control is not None:
            target.control.set_gate(False)
        return self.name
