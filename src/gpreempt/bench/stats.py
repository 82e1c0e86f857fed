"""Statistics of one scenario: latency summaries, rates inside a window, repeat summaries.

Pure functions over plain lists, so every number in a report can be checked on a CPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default method)."""
    if not values:
        raise ValueError("percentile of an empty list")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float] | None:
    """mean, p50, p95, p99 and (population) std of latencies in ms; None when there are none."""
    if not latencies_ms:
        return None
    return {
        "mean": statistics.fmean(latencies_ms),
        "p50": percentile(latencies_ms, 50),
        "p95": percentile(latencies_ms, 95),
        "p99": percentile(latencies_ms, 99),
        "std": statistics.pstdev(latencies_ms),
    }


def tail_summary(values_ms: Sequence[float]) -> dict[str, float] | None:
    """p50, p99 and max (used for preemption latency); None when there are none."""
    if not values_ms:
        return None
    return {
        "p50": percentile(values_ms, 50),
        "p99": percentile(values_ms, 99),
        "max": float(max(values_ms)),
        "count": len(values_ms),
    }


def count_in_window(times: Iterable[float], start: float, end: float) -> int:
    """How many timestamps fall in the closed window [start, end]."""
    return sum(1 for t in times if start <= t <= end)


def rate_in_window(step_times: Sequence[Sequence[float]], start: float, end: float) -> float:
    """Steps per second completed in [start, end], summed over processes."""
    if end <= start:
        raise ValueError(f"empty window [{start}, {end}]")
    return sum(count_in_window(times, start, end) for times in step_times) / (end - start)


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None when either is missing or the reference is not positive."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def served_rate(arrivals: Sequence[float], ends: Sequence[float]) -> float:
    """Requests per second served from the first scheduled arrival to the last completion."""
    span = max(ends) - min(arrivals)
    return len(ends) / span if span > 0 else float("inf")


def median_and_spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min and max of the known values of one metric over repeats."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": statistics.median(known),
        "min": min(known),
        "max": max(known),
        "n": len(known),
    }


def combine_repeats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One scenario row out of its repeats: the median of every number, its spread beside it.

    Numbers (also inside nested dicts, e.g. ``a_latency_ms.p99``) become the median over
    repeats; ``spread`` maps each dotted name to {median, min, max, n}. ``valid`` is true only
    when every repeat was valid. Non-numeric fields come from the first repeat.
    """
    if not rows:
        raise ValueError("no repeats to combine")
    if len(rows) == 1:
        return {**rows[0], "repeats": 1, "spread": {}}
    spread: dict[str, Any] = {}

    def merge(parts: Sequence[Any], name: str) -> Any:
        first = parts[0]
        if isinstance(first, Mapping):
            keys = [k for k in first if all(isinstance(p, Mapping) and k in p for p in parts)]
            return {k: merge([p[k] for p in parts], f"{name}.{k}" if name else k) for k in keys}
        known = [p for p in parts if p is not None]
        if known and all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in known):
            summary = median_and_spread(known)
            spread[name] = summary
            return summary["median"]
        return first

    merged = {k: merge([row.get(k) for row in rows], k) for k in rows[0]}
    merged["valid"] = all(bool(row.get("valid")) for row in rows)
    reasons = [row.get("invalid_reason") for row in rows if row.get("invalid_reason")]
    merged["invalid_reason"] = "; ".join(dict.fromkeys(reasons)) or None
    merged["repeats"] = len(rows)
    merged["spread"] = spread
    return merged
