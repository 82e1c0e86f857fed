"""Checks of one field of a client's request: its type and its range, with one clear line.

``true`` is not a pid and ``1e308`` is not a time slice: every field a client sends is read
through one of these before anything acts on it, on both sides of the socket
(:mod:`gpreempt.messages`). A wrong field raises :class:`BadField`, a UsageError the daemon
answers as ``bad '<op>' request: <what was wrong>``.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import UsageError

#: Sane ranges of the numeric fields of a registration.
MAX_PID = 2**31 - 1
MAX_GPU_INDEX = 1023
TIMESLICE_MS_RANGE = (0.1, 600_000.0)
MAX_RESERVE_BYTES = 2**50
#: GPUs one task may name.
MAX_GPUS = 64


class BadField(UsageError):
    """A request field of the wrong type or out of range."""


def whole(value: Any, what: str, low: int, high: int) -> int:
    """``value`` as an integer in [low, high]; UsageError for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadField(f"{what} must be a whole number, not {_shown(value)}")
    if not low <= value <= high:
        raise BadField(f"{what} must be from {low} to {high}, got {value}")
    return value


def number(value: Any, what: str, low: float, high: float, *, open_low: bool = False) -> float:
    """``value`` as a finite float in [low, high] (``open_low``: (low, high])."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadField(f"{what} must be a number, not {_shown(value)}")
    result = float(value)
    below = result <= low if open_low else result < low
    if not math.isfinite(result) or below or result > high:
        bracket = "(" if open_low else "["
        raise BadField(f"{what} must be in {bracket}{low:g}, {high:g}], got {value!r}")
    return result


def flag(value: Any, what: str) -> bool:
    """A JSON boolean (absent or null counts as false)."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadField(f"{what} must be true or false, not {_shown(value)}")
    return value


def text(value: Any, what: str) -> str | None:
    """A string or nothing."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadField(f"{what} must be a string, not {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
