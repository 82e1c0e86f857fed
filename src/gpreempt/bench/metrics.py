"""From what a scenario's processes recorded to the numbers of BENCHMARK.md.

- Case-A latency = completion - *scheduled* arrival (queueing counts); ``a_p99_ratio`` against
  Case-A alone on the same arrivals.
- ``a_served``: Case-A's requests per second from first arrival to last completion, against
  Case-A alone (1.0 = kept up with the offered load as well as alone).
- ``b_kept``: Case-B steps per second completed inside Case-A's window (first arrival to last
  completion), summed over Case-B processes, against Case-B alone with as many processes.
- ``system_throughput`` = a_served + b_kept (sequential sharing gives 1.0).
- ``preempt_latency_ms``: the daemon's ``suspend`` events' ``latency_ms``, p50/p99/max.
"""

from __future__ import annotations

from typing import Any

from . import eventlog, stats
from .scenarios import DESCRIPTIONS, RawScenario


def a_latencies_ms(serve: dict[str, Any]) -> list[float]:
    """Per request: completion - scheduled arrival, in ms."""
    return [
        (end - due) * 1000.0 for due, end in zip(serve["scheduled"], serve["end"], strict=False)
    ]


def b_step_times(raw: RawScenario) -> list[list[float]] | None:
    """Each Case-B process's step completion times; None when a process recorded none at all
    (a user command that does not report its steps)."""
    times = [t.get("step_end_t") for t in raw.trains]
    if any(t is None for t in times):
        return None
    return [list(t) for t in times]


def b_rate(raw: RawScenario) -> float | None:
    """Case-B steps/s inside the scenario's window, summed over processes."""
    times = b_step_times(raw)
    if raw.window is None or times is None or raw.window[1] <= raw.window[0]:
        return None
    return stats.rate_in_window(times, *raw.window)


def a_served_rate(raw: RawScenario) -> float | None:
    if not raw.serve:
        return None
    return stats.served_rate(raw.serve["scheduled"], raw.serve["end"])


def scenario_metrics(
    raw: RawScenario,
    a_alone: RawScenario | None,
    b_alone_rate: float | None,
) -> dict[str, Any]:
    """One row of results.json for one repeat of one scenario."""
    row: dict[str, Any] = {
        "description": DESCRIPTIONS.get(raw.name, raw.name),
        "valid": raw.valid,
        "invalid_reason": raw.reason,
        "window_s": (raw.window[1] - raw.window[0]) if raw.window else None,
    }
    ref_p99 = None
    if a_alone is not None and a_alone.serve:
        ref_p99 = stats.percentile(a_latencies_ms(a_alone.serve), 99)
    if raw.serve:
        latency = stats.latency_summary(a_latencies_ms(raw.serve))
        row["a_latency_ms"] = latency
        row["a_p99_ratio"] = stats.ratio(latency["p99"] if latency else None, ref_p99)
        row["a_served"] = stats.ratio(
            a_served_rate(raw), a_served_rate(a_alone) if a_alone else None
        )
        row["a_requests"] = len(raw.serve["end"])
    else:
        row.update(a_latency_ms=None, a_p99_ratio=None, a_requests=0)
        row["a_served"] = 0.0 if raw.name == "b-alone" else None
    if raw.trains:
        rate = b_rate(raw)
        row["b_steps_per_s"] = rate
        row["b_kept"] = stats.ratio(rate, b_alone_rate)
    else:
        row["b_steps_per_s"] = 0.0
        row["b_kept"] = 0.0
    row["system_throughput"] = (
        row["a_served"] + row["b_kept"]
        if row["a_served"] is not None and row["b_kept"] is not None
        else None
    )
    if raw.name.startswith("gpreempt-"):
        events = eventlog.in_window(raw.events, *raw.window) if raw.window else raw.events
        row["preempt_latency_ms"] = stats.tail_summary(eventlog.suspend_latencies_ms(events))
        if raw.window:
            periods = eventlog.suspended_periods(raw.events, "case-b", raw.window[1])
            fractions = [eventlog.suspended_fraction(p, *raw.window) for p in periods.values()]
            row["b_suspended_fraction"] = sum(fractions) / len(fractions) if fractions else 0.0
        row["suspensions"] = sum(1 for e in events if e.get("event") == "suspend")
    else:
        row["preempt_latency_ms"] = None
    row["gpu_util"] = raw.gpu
    return row


def sequential_metrics(a_row: dict[str, Any], b_row: dict[str, Any]) -> dict[str, Any]:
    """Case-A then Case-B on an unshared GPU: Case-A's numbers alone, no Case-B work in its
    window (system throughput 1.0). Built from the a-alone and b-alone measurements."""
    valid = bool(a_row.get("valid")) and bool(b_row.get("valid"))
    reasons = [r for r in (a_row.get("invalid_reason"), b_row.get("invalid_reason")) if r]
    return {
        "description": DESCRIPTIONS["sequential"],
        "valid": valid,
        "invalid_reason": "; ".join(reasons) or None,
        "derived_from": ["a-alone", "b-alone"],
        "window_s": a_row.get("window_s"),
        "a_latency_ms": a_row.get("a_latency_ms"),
        "a_p99_ratio": a_row.get("a_p99_ratio"),
        "a_served": a_row.get("a_served"),
        "a_requests": a_row.get("a_requests"),
        "b_steps_per_s": 0.0,
        "b_kept": 0.0,
        "system_throughput": a_row.get("a_served"),
        "preempt_latency_ms": None,
        "gpu_util": a_row.get("gpu_util"),
    }
