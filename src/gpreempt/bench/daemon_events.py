"""Reading the daemon's event log (``<runtime_dir>/events.jsonl``) for a benchmark.

Each line is one JSON object (see the daemon's event format): ``t`` is unix time, ``event``
names what happened, ``latency_ms`` on a ``suspend`` is how long the mechanism's call took.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..daemon.event_log import read_all_events

Event = dict[str, Any]


def read_events(path: Path) -> list[Event]:
    """Every well-formed event in the file, in order; a missing file gives none.

    A torn last line (the daemon was killed mid-write) is skipped, not fatal.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events


def read_log(path: Path) -> list[Event]:
    """The events of the daemon's log at ``path`` and of its previous generation (the daemon
    rotates a big log), oldest first."""
    return list(read_all_events(path))


def in_window(events: Iterable[Event], start: float, end: float) -> list[Event]:
    """Events whose unix time ``t`` lies in [start, end]."""
    return [e for e in events if isinstance(e.get("t"), (int, float)) and start <= e["t"] <= end]


def suspend_latencies_ms(events: Iterable[Event]) -> list[float]:
    """``latency_ms`` of every ``suspend`` event that carries one."""
    return [
        float(e["latency_ms"])
        for e in events
        if e.get("event") == "suspend" and isinstance(e.get("latency_ms"), (int, float))
    ]


def suspended_periods(
    events: Sequence[Event], task_prefix: str, end: float
) -> dict[str, list[tuple[float, float]]]:
    """Per task whose name starts with ``task_prefix``: the (start, stop) unix times it was
    suspended, from ``suspend``/``hold``/``evict`` to ``resume``/``release``/``restore``/``exit``.
    A period still open at the end of the log closes at ``end``.
    """
    opening = {"suspend", "hold", "evict"}
    closing = {"resume", "release", "restore", "exit"}
    periods: dict[str, list[tuple[float, float]]] = {}
    open_since: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e.get("t", 0.0)):
        task = str(event.get("task") or "")
        if not task.startswith(task_prefix) or not isinstance(event.get("t"), (int, float)):
            continue
        kind = event.get("event")
        if kind in opening and task not in open_since:
            open_since[task] = float(event["t"])
        elif kind in closing and task in open_since:
            periods.setdefault(task, []).append((open_since.pop(task), float(event["t"])))
    for task, since in open_since.items():
        periods.setdefault(task, []).append((since, max(since, end)))
    return periods


def suspended_fraction(periods: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Share of [start, end] covered by the given (non-overlapping) suspended periods."""
    if end <= start:
        return 0.0
    covered = sum(max(0.0, min(b, end) - max(a, start)) for a, b in periods)
    return covered / (end - start)


def active_periods(events: Sequence[Event], task: str, end: float) -> list[tuple[float, float]]:
    """The (start, stop) unix times the daemon saw ``task`` active, from its ``active`` to its
    ``idle`` event; a period still open at the end of the log closes at ``end``."""
    periods: list[tuple[float, float]] = []
    since: float | None = None
    for event in sorted(events, key=lambda e: e.get("t", 0.0)):
        if event.get("task") != task or not isinstance(event.get("t"), (int, float)):
            continue
        if event.get("event") == "active" and since is None:
            since = float(event["t"])
        elif event.get("event") == "idle" and since is not None:
            periods.append((since, float(event["t"])))
            since = None
    if since is not None:
        periods.append((since, max(since, end)))
    return periods


def late_steps(
    step_ends: Sequence[float], periods: Sequence[tuple[float, float]], step_s: float
) -> list[float]:
    """How far (s) into one of ``periods`` each step that completed more than 1.5 step times
    (``step_s``) after the period began did so. A trainer held while the period lasts may only
    finish the step it was running when it began: a later one ran while it should have been
    held, or the period's task dropped its activity for moments its events do not show."""
    return [t - period[0] for t, period in late_steps_in(step_ends, periods, step_s)]


def late_steps_in(
    step_ends: Sequence[float], periods: Sequence[tuple[float, float]], step_s: float
) -> list[tuple[float, tuple[float, float]]]:
    """The late steps of :func:`late_steps`, each as (when it completed, its period)."""
    starts = [p[0] for p in periods]
    late = []
    for t in step_ends:
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t <= periods[i][1] and t - periods[i][0] > 1.5 * step_s:
            late.append((t, periods[i]))
    return late
