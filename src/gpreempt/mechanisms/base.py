"""The one small interface every preemption mechanism implements."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..control_block import ControlBlock


@dataclass(frozen=True)
class MechanismSettings:
    """The daemon's settings the mechanisms are built with (``gpreempt serve`` options)."""

    #: How long one driver lock call may wait for a process's queued work (None: its default).
    lock_timeout_ms: int | None = None


@dataclass
class Target:
    """What a mechanism acts on: one task's process and what the daemon knows of it."""

    pid: int
    #: Signal this process group rather than the pid alone (tasks started by ``gpreempt run``).
    pgid: int | None = None
    #: The in-process control block, when the task's process runs the client (one whose gate
    #: is installed, where several processes or gates of the task have blocks).
    control: ControlBlock | None = None
    #: Every control block of the task: each process of it, and a driver-level gate's own
    #: channel beside a Python client's block. A gate closes them all.
    controls: tuple[ControlBlock, ...] = ()
    #: The process's start time (clock ticks since boot), when known: signals then reach
    #: this very process, never one that took its pid after it exited.
    start_time: int | None = None
    #: A pidfd of the process, opened when it was registered (checked against its start
    #: time then): signals through it reach that process or none, with no /proc read.
    pidfd: int | None = None


class Mechanism(abc.ABC):
    """Suspend and resume one task; report whether it can work for a given target."""

    #: Name used on the command line and in events (a :class:`~gpreempt.names.MechanismName`).
    name: str = ""
    #: What to use instead, said after why the mechanism is not available on a machine.
    instead: str = ""

    # What the daemon needs to know of a mechanism, asked instead of its name.
    #: The daemon closes and opens the task's in-process gate (its control block's word).
    closes_gate: bool = False
    #: The suspension lives in the task's own process, which undoes it by itself when the
    #: daemon goes away: nothing to persist, nothing for a new daemon to resume.
    in_process: bool = False
    #: The driver's checkpoint lock holds the process (a new daemon unlocks it; eviction,
    #: which takes that lock too, has nothing to undo after a restore).
    holds_driver_lock: bool = False
    #: The process's threads are stopped (SIGSTOP): anything that needs them to run, as the
    #: driver lock does, must continue them first.
    stops_process: bool = False
    #: The task's GPU queues are unmapped, by the tracer of its launcher (AMD KFD): a new
    #: daemon asks that tracer to map them again.
    unmaps_queues: bool = False
    #: The daemon backs the mechanism up: with the driver lock behind a gate that could not
    #: hold the task (daemon/backstop.py), and with signals where the suspension failed.
    backed_up: bool = False
    #: It suspends with one of the others, chosen at each suspension: it is built over them.
    chooses: bool = False

    @classmethod
    def create(cls, settings: MechanismSettings, others: Mapping[str, Mechanism]) -> Mechanism:
        """The daemon's instance of this mechanism; ``others``: the mechanisms that do not
        choose, built first (what a choosing one picks from). Raises MechanismUnavailable,
        saying why, where it cannot work on this machine at all (no driver, no device)."""
        return cls()

    @abc.abstractmethod
    def check(self, target: Target) -> None:
        """Raise MechanismUnavailable, saying why, if this mechanism cannot act on ``target``."""

    @abc.abstractmethod
    def suspend(self, target: Target) -> str:
        """Stop the task from using the GPU; return the name of what was actually used."""

    @abc.abstractmethod
    def resume(self, target: Target) -> str:
        """Undo :meth:`suspend`; return the name of what was actually used. Must be idempotent."""

    @classmethod  # noqa: B027 - optional hook
    def undo_leftovers(cls, target: Target) -> None:
        """Undo what a suspension by this mechanism leaves on ``target`` once the daemon that
        made it is gone (a new daemon calls it for each process the old one recorded, then
        continues the process). Built from the class alone: the new daemon may lack the
        mechanism's instance. Nothing by default: a signal is undone by the continue that
        follows, a gate by its own process. Raises OSError or GpreemptError if it fails."""

    def take_degradation(self, target: Target) -> str | None:
        """Why the last :meth:`suspend` of ``target`` held less than this mechanism promises
        (its name in the answer says what held it), once; None when it held all."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the mechanism holds (libraries, threads)."""
