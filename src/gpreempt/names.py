"""The names of the parts a user picks by name: preemption mechanisms and scheduling policies.

This is the one place they are spelled. Each name is a ``str``: it equals, hashes, prints and
formats as its text, so the wire (``"mechanism": "gate"``), the command line, the event log and
the persisted state keep the same strings, and a name read back from any of them compares equal
to its member. Each has one registry that maps it to its code: ``mechanisms.KINDS`` (the
mechanism classes) and ``policy.factory.POLICIES`` (the policies' ``decide`` functions); a test
checks that every name has its entry and every entry its name.

A new mechanism or policy is its own module, one member here, one entry in its registry, and
its tests; nothing else names it.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from .errors import UsageError

N = TypeVar("N", bound="Name")


class Name(str, enum.Enum):
    """A name that is its text everywhere: ``str()``, ``format()``, ``repr()`` and JSON."""

    __str__ = str.__str__
    __format__ = str.__format__

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def texts(cls) -> tuple[str, ...]:
        """Every name's text, in the order they are declared (choices on a command line)."""
        return tuple(member.value for member in cls)

    @classmethod
    def parse(cls: type[N], text: str, what: str) -> N:
        """The member spelled ``text``; a UsageError listing the choices for any other text
        (``what``: the kind of name, as the message says it)."""
        try:
            return cls(text)
        except ValueError:
            raise UsageError(
                f"unknown {what} {text!r}: choose one of {', '.join(cls.texts())}"
            ) from None


class MechanismName(Name):
    """How a task is suspended (``--mechanism``); ``mechanisms/__init__.py`` says what each does."""

    AUTO = "auto"
    GATE = "gate"
    LOCK = "lock"
    SIGNAL = "signal"
    KFD = "kfd"


class PolicyName(Name):
    """Which tasks a daemon suspends (``gpreempt serve --policy``); see ``policy/``."""

    HPF = "hpf"
    SHARE = "share"
    TIMESLICE = "timeslice"


__all__ = ["MechanismName", "Name", "PolicyName"]
