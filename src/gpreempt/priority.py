"""Priorities: the one place that maps names to numbers.

A priority is an integer in [-255, 255]; larger means more important, as in a Kubernetes
PriorityClass. Three names cover the common cases:

========  =====
name      value
========  =====
high       100
normal       0
low       -100
========  =====

Tasks of equal priority never preempt each other.
"""

from __future__ import annotations

from .errors import PriorityError

MIN_PRIORITY = -255
MAX_PRIORITY = 255

NAMED: dict[str, int] = {"high": 100, "normal": 0, "low": -100}


def parse_priority(value: str | int) -> int:
    """Turn ``"high"``, ``"low"``, ``"normal"``, ``"42"`` or ``42`` into an integer priority.

    Raises PriorityError (a ValueError) for anything else, saying what is accepted.
    """
    if isinstance(value, bool):
        raise PriorityError(f"priority must be a name or an integer, not {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        text = value.strip().lower()
        if text in NAMED:
            return NAMED[text]
        try:
            number = int(text, 10)
        except ValueError:
            raise PriorityError(
                f"unknown priority {value!r}: use high, normal, low, or an integer "
                f"from {MIN_PRIORITY} to {MAX_PRIORITY} (larger = more important)"
            ) from None
    else:
        raise PriorityError(f"priority must be a name or an integer, not {type(value).__name__}")
    if not MIN_PRIORITY <= number <= MAX_PRIORITY:
        raise PriorityError(
            f"priority {number} is out of range: use an integer from {MIN_PRIORITY} "
            f"to {MAX_PRIORITY}, or high ({NAMED['high']}), normal (0), low ({NAMED['low']})"
        )
    return number


def priority_name(value: int) -> str:
    """The class name of a priority if it has one, else the number as text."""
    for name, number in NAMED.items():
        if number == value:
            return name
    return str(value)
