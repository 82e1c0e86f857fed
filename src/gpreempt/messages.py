"""The requests clients send the daemon, as typed values: one frozen dataclass per op.

The wire format is a JSON object with an ``op`` and the op's fields (:mod:`gpreempt.protocol`
frames it). The client builds a request and sends ``to_wire()``; the daemon reads it back with
``from_wire(message)``, which checks every field's type and range (:mod:`.field_checks`) and
raises one clear line (:class:`~gpreempt.field_checks.BadField`, a UsageError) for a wrong
one, so that its handlers read attributes, never ``message.get(...)``. Ops without fields
(``ping``, ``status``) have no class. Replies stay plain objects: they are read by people and
by tools as JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import UsageError
from .field_checks import (
    MAX_GPU_INDEX,
    MAX_GPUS,
    MAX_PID,
    MAX_RESERVE_BYTES,
    TIMESLICE_MS_RANGE,
    flag,
    number,
    text,
    whole,
)
from .names import MechanismName
from .priority import parse_priority


def _gpu_index(value: Any) -> int:
    return whole(value, "a GPU index", 0, MAX_GPU_INDEX)


@dataclass(frozen=True)
class TaskFields:
    """What a task is registered with (``gpreempt run`` / ``attach`` options, the Python API).

    Built from the wire, from command-line options or by the client alike, it parses its
    priority (a name such as ``"high"``, or a number) and its mechanism's name itself: the
    one place they are parsed, so a bad one is the same clear UsageError wherever it comes
    from, and every holder reads an int and a :class:`~gpreempt.names.MechanismName`.
    """

    #: Its name (None: the process's name); the daemon makes it unique per owner.
    name: str | None = None
    #: Larger = more important (gpreempt.priority); a priority's name is turned into its number.
    priority: int = 0
    gpus: tuple[int, ...] = (0,)
    #: The mechanism asked for (``auto``: the default).
    mechanism: MechanismName = MechanismName.AUTO
    always_active: bool = False
    timeslice_ms: float | None = None
    min_share: float | None = None
    #: GPU memory to make room for while active (0: none).
    reserve_bytes: int = 0
    #: Check now that the mechanism can act on the process (a running process: ``attach``).
    check: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "priority", parse_priority(self.priority))
        object.__setattr__(self, "mechanism", MechanismName.parse(self.mechanism, "mechanism"))

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> TaskFields:
        """The task fields of ``message``, each checked (BadField or UsageError if wrong),
        in the order a client's options are read."""
        name = text(message.get("name"), "name")
        raw_gpus = message.get("gpus")
        if raw_gpus is None:
            raw_gpus = [0]
        if not isinstance(raw_gpus, list) or not 1 <= len(raw_gpus) <= MAX_GPUS:
            raise UsageError(f"gpus must be a list of 1 to {MAX_GPUS} GPU indexes")
        gpus = tuple(_gpu_index(g) for g in raw_gpus)
        mechanism = text(message.get("mechanism"), "mechanism") or MechanismName.AUTO
        check = flag(message.get("check"), "check")
        timeslice = message.get("timeslice_ms")
        if timeslice is not None:
            low, high = TIMESLICE_MS_RANGE
            timeslice = number(timeslice, "--timeslice-ms", low, high)
        min_share = message.get("min_share")
        if min_share is not None:
            min_share = number(min_share, "--min-share", 0, 1, open_low=True)
        reserve = message.get("reserve_bytes") or 0
        reserve = whole(reserve, "--reserve-memory", 0, MAX_RESERVE_BYTES)
        return cls(
            name=name,
            priority=message.get("priority", 0),
            gpus=gpus,
            mechanism=mechanism,
            always_active=flag(message.get("always_active"), "always_active"),
            timeslice_ms=timeslice,
            min_share=min_share,
            reserve_bytes=reserve,
            check=check,
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "name": self.name,
            "priority": self.priority,
            "gpus": list(self.gpus),
            "mechanism": self.mechanism,
            "always_active": self.always_active,
        }
        optional = {
            "timeslice_ms": self.timeslice_ms,
            "min_share": self.min_share,
            "reserve_bytes": self.reserve_bytes or None,
            "check": self.check or None,
        }
        wire.update({key: value for key, value in optional.items() if value is not None})
        return wire


@dataclass(frozen=True)
class RegisterRequest:
    """``register``: make process ``pid`` a task (``gpreempt run``'s child, ``attach``)."""

    pid: int
    task: TaskFields
    #: The task ends when this connection closes (a launcher's child).
    owned: bool = False

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> RegisterRequest:
        return cls(
            pid=whole(message.get("pid"), "pid", 1, MAX_PID),
            owned=flag(message.get("owned"), "owned"),
            task=TaskFields.from_wire(message),
        )

    def to_wire(self) -> dict[str, Any]:
        return {"op": "register", "pid": self.pid, **self.task.to_wire(), "owned": self.owned}


@dataclass(frozen=True)
class ChannelRequest:
    """``channel``: bind the caller's control block (sent as descriptors beside the message)
    to its task, registering the caller with ``register`` if it is no task's yet.

    ``gpu``: the GPU the caller uses, where it knows it (a rank of a multi-process job,
    :mod:`gpreempt.client.ranks`): the daemon counts its task on that GPU too."""

    register: TaskFields | None = None
    gpu: int | None = None

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> ChannelRequest:
        gpu = message.get("gpu")
        gpu = None if gpu is None else _gpu_index(gpu)
        register = message.get("register")
        if not register:
            return cls(gpu=gpu)
        if not isinstance(register, dict):
            raise UsageError("register must be an object of task fields")
        return cls(TaskFields.from_wire(register), gpu)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"op": "channel"}
        if self.register is not None:
            wire["register"] = self.register.to_wire()
        if self.gpu is not None:
            wire["gpu"] = self.gpu
        return wire


def _target(message: Mapping[str, Any]) -> str:
    target = message.get("target")
    if isinstance(target, bool) or not isinstance(target, (str, int)):
        raise UsageError("target must be a task name or pid")
    return str(target)


@dataclass(frozen=True)
class TargetRequest:
    """``detach``, ``evict`` or ``restore`` of one task, named by pid or name."""

    op: str
    target: str

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> TargetRequest:
        return cls(op=str(message.get("op")), target=_target(message))

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, "target": self.target}


@dataclass(frozen=True)
class HoldRequest:
    """``hold``: keep one task suspended whatever the policy says (``gpreempt suspend``), or
    release it (``gpreempt resume``)."""

    target: str
    hold: bool

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> HoldRequest:
        return cls(target=_target(message), hold=flag(message.get("hold"), "hold"))

    def to_wire(self) -> dict[str, Any]:
        return {"op": "hold", "target": self.target, "hold": self.hold}


__all__ = ["ChannelRequest", "HoldRequest", "RegisterRequest", "TargetRequest", "TaskFields"]
