"""Preemption mechanisms behind one interface (:class:`Mechanism`).

=========  ==============================================================  ===============
name       how                                                             works on
=========  ==============================================================  ===============
gate       the task's own launch gate stops submitting; bounded in-flight  PyTorch, any GPU
           work drains
lock       driver checkpoint lock: no more CUDA calls, in-flight drained    NVIDIA, r570+
signal     SIGSTOP/SIGCONT of the task's process group                      everything
kfd        SIGSTOP, and its GPU queues unmapped through the KFD debugger    AMD (ROCm),
           interface (waves saved by CWSR), by its tracer                  gpreempt run
auto       gate where installed (the daemon adds the driver lock once the  everything
           gate has held the task a while), else lock where the driver
           can, else signal; chosen at each suspension
=========  ==============================================================  ===============
"""

from __future__ import annotations

from ..errors import MechanismUnavailable, UsageError
from ..names import MechanismName
from .auto import AutoMechanism
from .base import Mechanism, MechanismSettings, Target
from .driver_lock import DriverLockMechanism
from .kfd import KfdMechanism
from .launch_gate import GateMechanism
from .signal import SignalMechanism

#: The registry: each mechanism's class by its name (one entry per :class:`MechanismName`).
#: What a mechanism can do (:class:`Mechanism`'s capabilities) is known without building it.
KINDS: dict[str, type[Mechanism]] = {
    cls.name: cls
    for cls in (
        AutoMechanism,
        GateMechanism,
        DriverLockMechanism,
        SignalMechanism,
        KfdMechanism,
    )
}


def kind(name: str | None) -> type[Mechanism]:
    """The class of mechanism ``name`` (a task's, or the one that suspended it); the base
    class, which can do nothing in particular, for None or a name that is no mechanism."""
    return KINDS.get(name or "", Mechanism)


class MechanismSet:
    """The daemon's mechanisms, built once: those that cannot work on this machine are left
    out, with the reason why, and those that choose are built over the others."""

    def __init__(self, lock_timeout_ms: int | None = None) -> None:
        settings = MechanismSettings(lock_timeout_ms=lock_timeout_ms)
        #: The mechanisms that suspend by themselves, by name.
        self.concrete: dict[str, Mechanism] = {}
        #: The mechanisms that choose one of the concrete ones, by name.
        self.choosing: dict[str, Mechanism] = {}
        #: Why each mechanism this machine lacks cannot work here, by name.
        self.unavailable: dict[str, str] = {}
        ordered = sorted(KINDS.items(), key=lambda item: item[1].chooses)
        for name, cls in ordered:
            built = self.choosing if cls.chooses else self.concrete
            try:
                built[name] = cls.create(settings, self.concrete)
            except MechanismUnavailable as exc:
                self.unavailable[name] = str(exc)

    @property
    def lock_unavailable(self) -> str | None:
        """Why the driver lock, which memory eviction and the backstop need too, cannot work
        here (None: it can)."""
        return self.unavailable.get(MechanismName.LOCK)

    def get(self, name: str) -> Mechanism:
        """The mechanism called ``name``; explains why when it cannot exist here."""
        found = self.concrete.get(name) or self.choosing.get(name)
        if found is not None:
            return found
        if name in self.unavailable:
            instead = KINDS[name].instead
            raise MechanismUnavailable(
                f"mechanism {name!r} is not available on this machine: {self.unavailable[name]}"
                + (f". {instead}" if instead else "")
            )
        raise UsageError(
            f"unknown mechanism {name!r}: choose one of {', '.join(MechanismName.texts())}"
        )


__all__ = [
    "KfdMechanism",
    "AutoMechanism",
    "DriverLockMechanism",
    "GateMechanism",
    "KINDS",
    "Mechanism",
    "MechanismName",
    "MechanismSet",
    "MechanismSettings",
    "SignalMechanism",
    "Target",
    "kind",
]
