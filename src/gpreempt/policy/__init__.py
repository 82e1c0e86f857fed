"""Scheduling policies: pure functions from a task snapshot to the set of tasks to suspend.

A policy is called as ``decide(snapshot, memory) -> Decision``; ``memory`` is whatever the
previous Decision returned in ``memory`` (None at first), so policies that need history
(time slices, shares) stay pure and testable without clocks. ``make_policy`` (factory.py)
builds one by name, with what the daemon must know of it. Open :mod:`.hpf` first: the
default, strict priority; :mod:`.snapshot` holds the values every policy reads and returns.
Every scheduler (the daemon, the in-process scheduler, the simulator) asks its policy through
one pass of the scheduling loop, :func:`.loop.run_pass`.
"""

from __future__ import annotations

from .factory import (
    POLICIES,
    BuiltPolicy,
    Policy,
    PolicySettings,
    get_policy,
    make_policy,
)
from .hpf import decide_hpf
from .share import decide_share
from .snapshot import Decision, Snapshot, TaskView
from .timeslice import decide_timeslice

__all__ = [
    "BuiltPolicy",
    "Decision",
    "Policy",
    "POLICIES",
    "PolicySettings",
    "Snapshot",
    "TaskView",
    "decide_hpf",
    "decide_share",
    "decide_timeslice",
    "get_policy",
    "make_policy",
]
