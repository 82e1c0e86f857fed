"""PNG plots of a run (matplotlib, imported only here), each saved with its data as JSON.

- ``latency_cdf.png``: Case-A latency CDF, one line per scenario.
- ``timeline.png``: the first 100 ms of each co-located scenario's window: each Case-A
  request's arrival, wait and service, Case-B's suspended periods (daemon events) shaded, and
  Case-B's step completions as ticks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import daemon_events
from .scenario_metrics import a_latencies_ms
from .scenarios import RawScenario


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_cdf(raws: Mapping[str, RawScenario], out_dir: Path) -> str | None:
    """Write latency_cdf.png/.json; returns the PNG's name, None when there is nothing."""
    data = {
        name: sorted(a_latencies_ms(raw.serve))
        for name, raw in raws.items()
        if raw.serve and raw.serve.get("end")
    }
    if not data:
        return None
    (out_dir / "latency_cdf.json").write_text(json.dumps(data))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in data.items():
        n = len(values)
        style = "--" if not raws[name].valid else "-"
        ax.plot(values, [(i + 1) / n for i in range(n)], style, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("Case-A latency from scheduled arrival (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.axhline(0.99, color="grey", linewidth=0.5)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Case-A latency CDF (dashed: invalid scenario)")
    fig.tight_layout()
    fig.savefig(out_dir / "latency_cdf.png", dpi=110)
    plt.close(fig)
    return "latency_cdf.png"


def _slice(raw: RawScenario, span_s: float) -> tuple[float, float] | None:
    """The first ``span_s`` of the window: where Case-A's queue starts (empty) and Case-B is
    first preempted."""
    if raw.window is None:
        return None
    start, end = raw.window
    return start, min(end, start + span_s)


def timeline(raws: Mapping[str, RawScenario], out_dir: Path, span_s: float = 0.1) -> str | None:
    """Write timeline.png/.json for every scenario that has both Case-A and Case-B."""
    names = [n for n, r in raws.items() if r.serve and r.trains and r.window]
    if not names:
        return None
    data: dict[str, Any] = {}
    for name in names:
        raw = raws[name]
        serve = raw.serve or {}
        begin, end = _slice(raw, span_s) or (0.0, 0.0)
        requests = [
            (due - begin, start - begin, done - begin)
            for due, start, done in zip(
                serve["scheduled"], serve["start"], serve["end"], strict=False
            )
            if done >= begin and due <= end
        ]
        periods = daemon_events.suspended_periods(raw.events, "case-b", raw.window[1])  # type: ignore[index]
        data[name] = {
            "origin_unix_t": begin,
            "requests_arrival_start_end_s": requests,
            "suspended": {
                task: [(a - begin, b - begin) for a, b in spans if b >= begin and a <= end]
                for task, spans in periods.items()
            },
            "b_steps": [
                [t - begin for t in (train.get("step_end_t") or []) if begin <= t <= end]
                for train in raw.trains
            ],
        }
    (out_dir / "timeline.json").write_text(json.dumps(data))
    plt = _pyplot()
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.9 * len(names) + 0.7), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=False):
        item = data[name]
        for spans in item["suspended"].values():
            for a, b in spans:
                ax.axvspan(a * 1e3, b * 1e3, color="tab:red", alpha=0.15, linewidth=0)
        for due, start, done in item["requests_arrival_start_end_s"]:
            ax.plot([due * 1e3], [1.35], "|", color="tab:blue", markersize=6)
            ax.plot([due * 1e3, start * 1e3], [1.2, 1.2], color="grey", linewidth=1)
            ax.plot([start * 1e3, done * 1e3], [1.0, 1.0], color="tab:blue", linewidth=4)
        for j, steps in enumerate(item["b_steps"]):
            ax.plot([t * 1e3 for t in steps], [0.5 - 0.1 * j] * len(steps), "|", color="tab:green")
        ax.set_ylim(0.1, 1.55)
        ax.set_yticks([0.5, 1.0, 1.2, 1.35], ["B step done", "A served", "A waits", "A arrives"])
        ax.set_xlim(0, span_s * 1e3)
        ax.set_title(f"{name} (red: Case-B suspended)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from Case-A's first arrival")
    fig.tight_layout()
    fig.savefig(out_dir / "timeline.png", dpi=100)
    plt.close(fig)
    return "timeline.png"


def all_plots(raws: Mapping[str, RawScenario], out_dir: Path) -> Sequence[str]:
    """Every plot; a missing matplotlib skips plots with a note instead of failing the run."""
    try:
        _pyplot()
    except ImportError:
        (out_dir / "plots-skipped.txt").write_text("matplotlib is not installed\n")
        return []
    return [p for p in (latency_cdf(raws, out_dir), timeline(raws, out_dir)) if p]
