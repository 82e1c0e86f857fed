"""From what a scenario's processes recorded to the numbers of BENCHMARK.md.

- Case-A latency = completion - *scheduled* arrival (queueing counts); ``a_p99_ratio`` against
  Case-A alone on the same arrivals. ``a_service_ms``: completion - start, the request's own
  time without its wait in the queue (``a_service_idle_ms``: only the requests that found the
  server idle, which are the ones that may wait for a trainer's queued work first;
  ``a_service_queued_ms``: only those that queued behind another, which find a trainer already
  held: what a held trainer still costs the server, without its hold's reaction).
- ``a_served``: Case-A's requests per second from first arrival to last completion, against
  Case-A alone (1.0 = kept up with the offered load as well as alone).
- ``b_kept``: Case-B steps per second completed inside Case-A's window (first arrival to last
  completion), summed over Case-B processes, against Case-B alone with as many processes.
- ``system_throughput`` = a_served + b_kept (sequential sharing gives 1.0).
- ``a_busy``: share of the window in which Case-A was serving a request (sum of its service
  times / window), the load it really put on the GPU; ``b_kept_of_idle`` = b_kept / (1 -
  a_busy), what Case-B got of the time Case-A left. A server whose service time drifts away
  from its calibration (an eager one) runs at another load than asked, and b_kept moves with it.
- ``preempt_latency_ms``: the daemon's ``suspend`` events' ``latency_ms``, p50/p99/max.
- ``hold_leaks``, ``backstop_stops`` (scenarios with a daemon): suspensions the daemon found
  not to hold, and the stops (driver lock, signals) it then put behind them.
- ``b_late_steps``: Case-B steps that completed well into one of Case-A's active periods (the
  daemon's ``active``/``idle`` events), more than 1.5 step times after it began: a held trainer
  may only finish the step it was running (:func:`b_late_steps`).
- ``a_slow_stretched``: Case-A's requests that took more than twice its median service time
  alone and came within 10 ms of another such one (:func:`slow_stretch`): stretches in which
  something shared the GPU with it. Counted alone too, where a machine shows them by itself.
- ``gpreempt-scheduler`` (no daemon): ``b_suspended_fraction`` from the scheduler's own
  accounting of Case-B's suspended time (Case-A is active only inside its window).
- memory scenarios: ``a_oom`` (Case-A did not get its growth), ``a_growth_request_ms`` (the
  latency of the request that grew), the daemon's ``evict``/``restore`` events (count, bytes,
  seconds, GB/s) and whether Case-B survived (exit code 0 and steps after its restore).
  No ``a_p99_ratio``: their Case-A serves eagerly (see ``workloads``), the reference replays a
  CUDA graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import daemon_events, stats
from .scenario_catalog import DAEMON_SETUPS, DESCRIPTIONS, MEMORY_SCENARIOS, SCHEDULER_SCENARIO
from .scenarios import RawScenario

GIB = 1 << 30


def a_latencies_ms(serve: dict[str, Any]) -> list[float]:
    """Per request: completion - scheduled arrival, in ms."""
    return [
        (end - due) * 1000.0 for due, end in zip(serve["scheduled"], serve["end"], strict=False)
    ]


def found_idle(serve: dict[str, Any]) -> list[bool]:
    """Per request: whether it arrived after the previous one had completed (the server idle);
    one that arrived before queued behind it, and met a trainer already held."""
    ends = [float("-inf"), *serve["end"]]
    return [due >= previous for due, previous in zip(serve["scheduled"], ends, strict=False)]


def a_service_ms(serve: dict[str, Any], found: str | None = None) -> list[float]:
    """Per request: completion - start, in ms; with ``found`` "idle", only the requests that
    found the server idle (:func:`found_idle`); "busy", only those that queued."""
    rows = zip(found_idle(serve), serve["start"], serve["end"], strict=False)
    return [
        (end - start) * 1000.0
        for idle, start, end in rows
        if found is None or idle == (found == "idle")
    ]


#: A request slower than SLOW_FACTOR times the reference service time is slow; one that starts
#: within STRETCH_GAP_S of the end of another slow one is in a stretch.
SLOW_FACTOR = 2.0
STRETCH_GAP_S = 0.01


def slow_limit_ms(service: Sequence[float], reference_ms: float | None = None) -> float:
    """Above this a request is slow: :data:`SLOW_FACTOR` times ``reference_ms`` (Case-A's
    median service time alone), or the median of ``service`` (its service times in this run,
    not empty) where None."""
    return SLOW_FACTOR * (reference_ms or stats.percentile(service, 50))


def slow_requests(serve: dict[str, Any], reference_ms: float | None = None) -> list[int]:
    """The indices of Case-A's slow requests (:func:`slow_limit_ms`)."""
    service = a_service_ms(serve)
    if not service:
        return []
    limit = slow_limit_ms(service, reference_ms)
    return [i for i, ms in enumerate(service) if ms > limit]


def slow_stretch(serve: dict[str, Any], reference_ms: float | None = None) -> list[int]:
    """The indices of Case-A's slow requests (:func:`slow_requests`) in stretches: starting
    within :data:`STRETCH_GAP_S` of the end of the slow one before."""
    stretched: list[int] = []
    last_slow_end: float | None = None
    for i in slow_requests(serve, reference_ms):
        if last_slow_end is not None and serve["start"][i] - last_slow_end < STRETCH_GAP_S:
            stretched.append(i)
        last_slow_end = serve["end"][i]
    return stretched


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


def a_busy(serve: dict[str, Any], window: tuple[float, float]) -> float | None:
    """Share of ``window`` covered by Case-A's requests (start to completion); None for an
    empty window. Requests are served one at a time, so their spans do not overlap."""
    span = window[1] - window[0]
    if span <= 0:
        return None
    busy = sum(
        max(0.0, min(end, window[1]) - max(start, window[0]))
        for start, end in zip(serve["start"], serve["end"], strict=False)
    )
    return min(1.0, busy / span)


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
        row["a_service_ms"] = stats.latency_summary(a_service_ms(raw.serve))
        row["a_service_idle_ms"] = stats.latency_summary(a_service_ms(raw.serve, "idle"))
        row["a_service_queued_ms"] = stats.latency_summary(a_service_ms(raw.serve, "busy"))
        row["a_p99_ratio"] = stats.ratio(latency["p99"] if latency else None, ref_p99)
        row["a_served"] = stats.ratio(
            a_served_rate(raw), a_served_rate(a_alone) if a_alone else None
        )
        row["a_requests"] = len(raw.serve["end"])
        row["a_busy"] = a_busy(raw.serve, raw.window) if raw.window else None
        alone_service = a_service_ms(a_alone.serve) if a_alone is not None and a_alone.serve else []
        alone_ms = stats.percentile(alone_service, 50) if alone_service else None
        row["a_slow_stretched"] = len(slow_stretch(raw.serve, alone_ms))
    else:
        row.update(
            a_latency_ms=None,
            a_service_ms=None,
            a_service_idle_ms=None,
            a_service_queued_ms=None,
            a_p99_ratio=None,
            a_requests=0,
            a_busy=0.0 if raw.name == "b-alone" else None,
        )
        row["a_served"] = 0.0 if raw.name == "b-alone" else None
    if raw.trains:
        rate = b_rate(raw)
        row["b_steps_per_s"] = rate
        row["b_kept"] = stats.ratio(rate, b_alone_rate)
    else:
        row["b_steps_per_s"] = 0.0
        row["b_kept"] = 0.0
    busy = row["a_busy"]
    row["b_kept_of_idle"] = (
        row["b_kept"] / (1.0 - busy)
        if raw.trains and row["b_kept"] is not None and busy is not None and busy < 1.0
        else None
    )
    row["system_throughput"] = (
        row["a_served"] + row["b_kept"]
        if row["a_served"] is not None and row["b_kept"] is not None
        else None
    )
    if raw.name == SCHEDULER_SCENARIO:
        row.update(preempt_latency_ms=None, suspensions=None)
        sched = (raw.trains[0] if raw.trains else {}).get("scheduler_stats") or {}
        suspended = (sched.get("case-b") or {}).get("suspended_seconds")
        window = row["window_s"]
        row["b_suspended_fraction"] = (
            min(1.0, suspended / window) if suspended is not None and window else None
        )
    elif raw.name in DAEMON_SETUPS:
        events = daemon_events.in_window(raw.events, *raw.window) if raw.window else raw.events
        row["preempt_latency_ms"] = stats.tail_summary(daemon_events.suspend_latencies_ms(events))
        if raw.window:
            periods = daemon_events.suspended_periods(raw.events, "case-b", raw.window[1])
            fractions = [daemon_events.suspended_fraction(p, *raw.window) for p in periods.values()]
            row["b_suspended_fraction"] = sum(fractions) / len(fractions) if fractions else 0.0
        row["suspensions"] = sum(1 for e in events if e.get("event") == "suspend")
        row["b_late_steps"] = b_late_steps(raw)
        row.update(held_checks(raw.events))
        row["b_gate"] = b_gate_counters(raw.trains)
        row["a_gate"] = a_gate_counters(raw.serve)
    else:
        row["preempt_latency_ms"] = None
    if raw.name in MEMORY_SCENARIOS:
        row.update(memory_metrics(raw))
        row["a_p99_ratio"] = None  # an eager Case-A against the graph-replayed reference
    row["gpu_util"] = raw.gpu
    return row


def b_late_steps(raw: RawScenario) -> int | None:
    """Case-B steps, over its processes, that completed more than 1.5 of their process's median
    step time into one of Case-A's active periods (daemon_events.late_steps): work that ran
    while it should have been held, or while Case-A's activity dropped for moments its events
    do not show. None without a window or trainers."""
    if raw.window is None or not raw.trains:
        return None
    begin, end = raw.window
    periods = daemon_events.active_periods(raw.events, "case-a", end)
    late = 0
    for train in raw.trains:
        ends = sorted(train.get("step_end_t") or [])
        gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        if gaps:
            inside = [t for t in ends if begin <= t <= end]
            late += len(daemon_events.late_steps(inside, periods, stats.percentile(gaps, 50)))
    return late


#: The launch gates' counters each Case-B process writes as it stops (its ``gate`` record,
#: workloads.py): summed over the processes, but the GPU time per launch, the largest.
OPERATOR_COUNTERS = ("launches", "barriers_put", "waits")
DRIVER_COUNTERS = ("driver_launches", "driver_barriers", "driver_waits", "driver_bound_waits",
                   "driver_barriers_checked")  # fmt: skip


def b_gate_counters(trains: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How Case-B's gates spent the scenario: the operator gate's launches, barriers and
    waits, and the driver-level gate's, with the GPU time per launch its barriers were spaced
    by (``driver_us_per_launch``). None where no process ran under a gate."""
    gates = [t["gate"] for t in trains if isinstance(t.get("gate"), Mapping)]
    if not gates:
        return None
    out: dict[str, Any] = {k: sum(int(g.get(k) or 0) for g in gates) for k in OPERATOR_COUNTERS}
    drivers = [g["driver"] for g in gates if isinstance(g.get("driver"), Mapping)]
    if drivers:
        out.update({k: sum(int(d.get(k) or 0) for d in drivers) for k in DRIVER_COUNTERS})
        costs = [float(d.get("driver_us_per_launch") or 0) for d in drivers]
        out["driver_us_per_launch"] = max(costs)
    return out


#: What Case-A's operator gate counted (workloads.py writes its ``gate`` record as it stops):
#: its hook counts operators only while awake, so ``launches`` against the operators its
#: requests ran tells how long it was awake, and a server's awake hook costs it each one.
SERVER_COUNTERS = ("launches", "sleeps", "activations")


def a_gate_counters(serve: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """How Case-A's own gates spent the scenario: the operator gate's launches (counted while
    awake), how often it fell asleep, its activations (first launches after idling), whether it
    was asleep at the end, and the driver-level gate's launches (seen while its callbacks were
    on). None where Case-A ran under no gate."""
    gate = (serve or {}).get("gate")
    if not isinstance(gate, Mapping):
        return None
    out: dict[str, Any] = {k: int(gate.get(k) or 0) for k in SERVER_COUNTERS}
    out["asleep_at_end"] = bool(gate.get("asleep"))
    driver = gate.get("driver")
    if isinstance(driver, Mapping):
        out["driver_launches"] = int(driver.get("driver_launches") or 0)
        out["driver_asleep_at_end"] = bool(driver.get("driver_asleep"))
    return out


def held_checks(events: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """What the daemon's checks found over the whole scenario: ``hold_leaks``, suspensions
    found not to hold (``error`` events, apply.py), and ``backstop_stops``, the tasks it then
    locked or signalled (``backstop`` events)."""
    return {
        "hold_leaks": sum(
            1
            for e in events
            if e.get("event") == "error" and "does not hold" in str(e.get("reason", ""))
        ),
        "backstop_stops": sum(1 for e in events if e.get("event") == "backstop"),
    }


def _moves(events: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    """count, bytes, seconds and GB/s (bytes over seconds) of the ``kind`` events."""
    chosen = [e for e in events if e.get("event") == kind]
    moved = sum(int(e.get("bytes") or 0) for e in chosen)
    seconds = sum(float(e.get("latency_ms") or 0.0) for e in chosen) / 1000.0
    return {
        "count": len(chosen),
        "bytes": moved,
        "gib": moved / GIB,
        "seconds": seconds,
        "gb_per_s": moved / seconds / 1e9 if seconds > 0 else None,
    }


def memory_metrics(raw: RawScenario) -> dict[str, Any]:
    """The memory scenarios' fields of a row (see the module docstring)."""
    serve = raw.serve or {}
    growth = serve.get("growth") or {}
    row: dict[str, Any] = {"memory_plan": raw.memory.get("plan")}
    row["a_oom"] = bool(growth["oom"]) if "oom" in growth else None
    # what Case-A held after the growth (a failed growth keeps nothing)
    row["a_growth_gib"] = (
        (0.0 if growth["oom"] else growth["got_bytes"] / GIB) if "got_bytes" in growth else None
    )
    row["a_free_before_growth_gib"] = (
        growth["free_before_bytes"] / GIB if "free_before_bytes" in growth else None
    )
    row["a_growth_s"] = growth.get("seconds")
    row["a_growth_waited_s"] = growth.get("waited_s")
    index = growth.get("index")
    if isinstance(index, int) and serve.get("end") and index < len(serve["end"]):
        row["a_growth_request_ms"] = (serve["end"][index] - serve["scheduled"][index]) * 1000.0
    else:
        row["a_growth_request_ms"] = None
    if raw.name in DAEMON_SETUPS:
        row["memory_events"] = {kind: _moves(raw.events, kind) for kind in ("evict", "restore")}
        errors = [e.get("reason") for e in raw.events if e.get("event") == "error"]
        row["memory_errors"] = [str(r) for r in errors if r]
    else:
        row["memory_events"] = None
    codes = raw.memory.get("b_exit_codes") or []
    row["b_exit_code"] = codes[0] if codes else None
    start = raw.memory.get("progress_from_t")
    steps = (raw.trains[0].get("step_end_t") or []) if raw.trains else []
    row["b_steps_after_restore"] = sum(1 for t in steps if t > start) if start is not None else None
    row["b_restored"] = (
        raw.memory.get("restore_t") is not None if raw.name in DAEMON_SETUPS else None
    )
    row["b_survived"] = bool(row["b_exit_code"] == 0 and row["b_steps_after_restore"])
    row["memory_notes"] = list(raw.memory.get("notes") or [])
    return row


def combine_memory_flags(
    merged: dict[str, Any], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Over repeats, Case-A ran out of memory if it did in any repeat, and Case-B survived
    only if it did in every one (other fields: see stats.combine_repeats)."""
    if "a_oom" in merged:
        flags = [r.get("a_oom") for r in rows if r.get("a_oom") is not None]
        merged["a_oom"] = any(flags) if flags else None
        merged["b_survived"] = all(bool(r.get("b_survived")) for r in rows)
        restored = [r.get("b_restored") for r in rows if r.get("b_restored") is not None]
        merged["b_restored"] = all(restored) if restored else None
    return merged


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
        "a_busy": a_row.get("a_busy"),
        "b_steps_per_s": 0.0,
        "b_kept": 0.0,
        "b_kept_of_idle": None,
        "system_throughput": a_row.get("a_served"),
        "preempt_latency_ms": None,
        "gpu_util": a_row.get("gpu_util"),
    }
