"""The ``auto`` mechanism (the default): at each suspension, the most precise one that works.

The launch gate where the task's process installed it (the daemon adds the driver lock once
the gate has held the task a while: daemon/backstop.py), else the driver lock where the
driver can lock the process, else signals, which always work.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import MechanismUnavailable
from ..names import MechanismName
from .base import Mechanism, MechanismSettings, Target

#: The mechanisms tried in turn, the most precise first; signals when none works.
PREFERRED = (MechanismName.GATE, MechanismName.LOCK)


class AutoMechanism(Mechanism):
    """Picks, at each suspension, the most precise mechanism that works for the task now."""

    name = MechanismName.AUTO
    closes_gate = True
    backed_up = True
    chooses = True

    def __init__(self, concrete: Mapping[str, Mechanism]) -> None:
        self._concrete = concrete

    @classmethod
    def create(cls, settings: MechanismSettings, others: Mapping[str, Mechanism]) -> Mechanism:
        return cls(others)

    def choose(self, target: Target) -> Mechanism:
        for name in PREFERRED:
            mechanism = self._concrete.get(name)
            if mechanism is None:
                continue
            try:
                mechanism.check(target)
            except MechanismUnavailable:
                continue
            return mechanism
        return self._concrete[MechanismName.SIGNAL]

    def check(self, target: Target) -> None:
        self._concrete[MechanismName.SIGNAL].check(target)

    def suspend(self, target: Target) -> str:
        return self.choose(target).suspend(target)

    def resume(self, target: Target) -> str:
        raise NotImplementedError("resume with the mechanism that suspended the task")
