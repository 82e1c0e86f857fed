"""The ``auto`` mechanism (the default): at each suspension, the most precise one that works.

The launch gate where the task's process installed it (the daemon adds the driver lock once
the gate has held the task a while: daemon/backstop.py), else the driver lock where the
driver can lock the process, else signals, which always work.
"""

from __future__ import annotations

from ..errors import MechanismUnavailable
from .base import Mechanism, Target


class AutoMechanism(Mechanism):
    """Picks, at each suspension, the most precise mechanism that works for the task now."""

    name = "auto"
    closes_gate = True
    backed_up = True

    def __init__(self, concrete: dict[str, Mechanism]) -> None:
        self._concrete = concrete

    def choose(self, target: Target) -> Mechanism:
        for name in ("gate", "lock"):
            mechanism = self._concrete.get(name)
            if mechanism is None:
                continue
            try:
                mechanism.check(target)
            except MechanismUnavailable:
                continue
            return mechanism
        return self._concrete["signal"]

    def check(self, target: Target) -> None:
        self._concrete["signal"].check(target)

    def suspend(self, target: Target) -> str:
        return self.choose(target).suspend(target)

    def resume(self, target: Target) -> str:
        raise NotImplementedError("resume with the mechanism that suspended the task")
