"""Building a policy by name: ``make_policy(name, settings) -> BuiltPolicy``.

A policy is a pure ``decide(snapshot, memory) -> Decision``; what else the daemon must know of
it travels with it here, so the daemon never asks which policy it runs: whether gated peers
take turns (and how long), and whether it is strict priority, the one kind under which a gate
may stop by itself for the tasks that outrank it (``policy/watch.py``) and sleep while they
are idle (``policy/sleep.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..names import PolicyName
from .hpf import decide_hpf
from .inflight import DEFAULT_BUDGET_MS
from .share import decide_share
from .snapshot import Policy
from .timeslice import decide_timeslice
from .turns import DEFAULT_TURN_MS, TurnSettings

#: The registry: each policy's ``decide`` by its name (one entry per :class:`PolicyName`), as
#: ``gpreempt serve --policy`` offers them.
POLICIES: dict[str, Policy] = {
    PolicyName.HPF: decide_hpf,
    PolicyName.TIMESLICE: decide_timeslice,
    PolicyName.SHARE: decide_share,
}

#: Policies under which a more important active task always suspends a less important one;
#: their ``decide`` takes ``turns=TurnSettings(...)`` for gated peers below it.
STRICT_PRIORITY = frozenset({PolicyName.HPF})


@dataclass(frozen=True)
class PolicySettings:
    """The daemon's settings a policy is built with (``gpreempt serve`` options)."""

    #: Turn length (ms) of gated peers below a more important task; 0 = side by side.
    turn_ms: float = DEFAULT_TURN_MS
    #: GPU time (ms) the gated lower tasks of one GPU keep in flight together.
    inflight_budget_ms: float = DEFAULT_BUDGET_MS


@dataclass(frozen=True)
class BuiltPolicy:
    """A policy ready to run, with what the daemon needs to know of it."""

    name: PolicyName
    decide: Policy
    #: Gates may stop by themselves for the tasks that outrank them, and sleep while those
    #: are idle (strict priority only).
    strict_priority: bool
    #: Length of the turns gated peers take (ms); 0 = no turns.
    turn_ms: float


def get_policy(name: str) -> Policy:
    """The policy registered under ``name``, or a UsageError listing the choices."""
    return POLICIES[PolicyName.parse(name, "policy")]


def make_policy(name: str, settings: PolicySettings | None = None) -> BuiltPolicy:
    """The policy ``name`` built with ``settings`` (UsageError for an unknown name)."""
    settings = settings or PolicySettings()
    chosen = PolicyName.parse(name, "policy")
    decide = POLICIES[chosen]
    strict = chosen in STRICT_PRIORITY
    turn_ms = settings.turn_ms if strict and settings.turn_ms > 0 else 0.0
    if turn_ms:
        decide = functools.partial(
            decide, turns=TurnSettings(turn_ms=turn_ms, budget_ms=settings.inflight_budget_ms)
        )
    return BuiltPolicy(name=chosen, decide=decide, strict_priority=strict, turn_ms=turn_ms)
