"""Open-loop load: Poisson arrival times, the same for every scenario of a run.

Pure code (no clocks, no I/O) so the schedule can be checked on any machine.
"""

from __future__ import annotations

import random

from ..errors import UsageError


def arrival_rate(load: float, service_s: float) -> float:
    """Requests per second that keep a server of mean service time ``service_s`` busy ``load``."""
    if not 0 < load < 1.5:
        raise UsageError(f"load must be in (0, 1.5), got {load}: 0.5 means half the GPU time")
    if service_s <= 0:
        raise UsageError(f"service time must be positive, got {service_s} s")
    return load / service_s


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """``count`` arrival offsets in seconds (first at 0) of a Poisson process of ``rate`` per s.

    Gaps are exponential draws from a private ``random.Random(seed)``, so one seed gives one
    schedule on every machine and in every scenario.
    """
    if count < 1:
        raise UsageError(f"the number of requests must be at least 1, got {count}")
    if rate <= 0:
        raise UsageError(f"arrival rate must be positive, got {rate}")
    rng = random.Random(seed)
    offsets = [0.0]
    for _ in range(count - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    return offsets


#: How far (relative) Case-A's busy share in its check run may lie from the load asked for
#: before the arrival rate is corrected.
LOAD_TOLERANCE = 0.03


def corrected_rate(
    rate: float, load: float, busy: float | None, tolerance: float = LOAD_TOLERANCE
) -> float:
    """The arrival rate that brings a server measured busy ``busy`` of the time at ``rate`` to
    ``load``: ``rate * load / busy`` where ``busy`` lies off ``load`` by more than
    ``tolerance`` (relative), else ``rate``; ``rate`` where nothing was measured."""
    if busy is None or busy <= 0 or abs(busy / load - 1.0) <= tolerance:
        return rate
    return rate * load / busy


def describe_load_check(check: dict | None, rate: float | None) -> str:
    """One sentence on a run's ``params.load_check`` (``rate``: the rate the run used); empty
    where the load was not checked."""
    if not check:
        return ""
    busy = check.get("a_busy")
    if busy is None:
        why = check.get("invalid_reason") or "nothing measured"
        return f"Case-A's load check alone failed ({why}); the calibrated rate stands."
    said = f"Case-A's load checked alone first: busy {busy:.2f} of the time"
    if check.get("corrected") and rate is not None:
        calibrated = check.get("rate_calibrated_per_s") or 0.0
        return f"{said} at {calibrated:.1f} requests/s, so the run used {rate:.1f}/s."
    return f"{said}, the calibrated rate stands."
