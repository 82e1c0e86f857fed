"""Scheduling policies: pure functions from a task snapshot to the set of tasks to suspend.

A policy is called as ``decide(snapshot, memory) -> Decision``; ``memory`` is whatever the
previous Decision returned in ``memory`` (None at first), so policies that need history
(time slices, shares) stay pure and testable without clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from .hpf import decide_hpf
from .share import decide_share
from .snapshot import Decision, Snapshot, TaskView
from .timeslice import decide_timeslice

Policy = Callable[[Snapshot, Any], Decision]

POLICIES: dict[str, Policy] = {
    "hpf": decide_hpf,
    "timeslice": decide_timeslice,
    "share": decide_share,
}


def get_policy(name: str) -> Policy:
    """The policy registered under ``name``, or a UsageError listing the choices."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UsageError(
            f"unknown policy {name!r}: choose one of {', '.join(sorted(POLICIES))}"
        ) from None


__all__ = [
    "Decision",
    "Policy",
    "POLICIES",
    "Snapshot",
    "TaskView",
    "decide_hpf",
    "decide_share",
    "decide_timeslice",
    "get_policy",
]
