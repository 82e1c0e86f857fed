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
from .auto import AutoMechanism
from .base import Mechanism, Target
from .driver_lock import DriverLockMechanism
from .kfd import KfdMechanism
from .launch_gate import GateMechanism
from .signal import SignalMechanism

NAMES = ("auto", "gate", "lock", "signal", "kfd")

#: Each mechanism's class by name: what it can do (:class:`Mechanism`'s capabilities) is known
#: without building it.
KINDS: dict[str, type[Mechanism]] = {
    "auto": AutoMechanism,
    "gate": GateMechanism,
    "lock": DriverLockMechanism,
    "signal": SignalMechanism,
    "kfd": KfdMechanism,
}


def kind(name: str | None) -> type[Mechanism]:
    """The class of mechanism ``name`` (a task's, or the one that suspended it); the base
    class, which can do nothing in particular, for None or a name that is no mechanism."""
    return KINDS.get(name or "", Mechanism)


class MechanismSet:
    """The daemon's mechanisms, built once; ``lock`` only where the driver offers it."""

    def __init__(self, lock_timeout_ms: int | None = None) -> None:
        self.concrete: dict[str, Mechanism] = {
            "signal": SignalMechanism(),
            "gate": GateMechanism(),
        }
        lock = (
            DriverLockMechanism()
            if lock_timeout_ms is None
            else DriverLockMechanism(lock_timeout_ms)
        )
        try:
            lock.driver  # noqa: B018 - loads libcuda and checks the API
        except MechanismUnavailable as exc:
            self.lock_unavailable: str | None = str(exc)
        else:
            self.lock_unavailable = None
            self.concrete["lock"] = lock
        self.kfd_unavailable = _kfd_unavailable()
        if self.kfd_unavailable is None:
            self.concrete["kfd"] = KfdMechanism()
        self.auto = AutoMechanism(self.concrete)

    def get(self, name: str) -> Mechanism:
        """The mechanism called ``name``; explains why when it cannot exist here."""
        if name == "auto":
            return self.auto
        if name == "lock" and self.lock_unavailable:
            raise MechanismUnavailable(
                f"mechanism 'lock' is not available on this machine: {self.lock_unavailable}. "
                "Use --mechanism signal (or auto, which falls back to signal)."
            )
        if name == "kfd" and self.kfd_unavailable:
            raise MechanismUnavailable(
                f"mechanism 'kfd' is not available on this machine: {self.kfd_unavailable}"
            )
        try:
            return self.concrete[name]
        except KeyError:
            raise UsageError(
                f"unknown mechanism {name!r}: choose one of {', '.join(NAMES)}"
            ) from None


def _kfd_unavailable() -> str | None:
    """Why the KFD debugger interface cannot be used here, or None if it can."""
    from .kfd_session import check_available

    try:
        check_available()
    except MechanismUnavailable as exc:
        return str(exc)
    return None


__all__ = [
    "KfdMechanism",
    "AutoMechanism",
    "DriverLockMechanism",
    "GateMechanism",
    "KINDS",
    "Mechanism",
    "MechanismSet",
    "NAMES",
    "SignalMechanism",
    "Target",
    "kind",
]
