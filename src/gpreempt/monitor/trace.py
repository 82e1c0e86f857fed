"""Per-stream analysis of PyTorch profiler (Kineto) Chrome traces, in pure Python.

``torch.profiler`` exports GPU activity as complete events (``"ph": "X"``) with
``"cat": "kernel"`` (``"gpu_memcpy"``, ``"gpu_memset"`` for copies), ``ts``/``dur`` in
microseconds, ``pid`` = device and ``tid`` = stream, and ``args`` holding ``"device"``,
``"stream"``, ``"correlation"``, ``"grid"``, ``"block"``, ... A CUDA stream (a HIP stream on
ROCm) is what feeds one hardware queue, so per-stream numbers are the NVIDIA/ROCm counterpart
of the per-queue numbers in HIP logs: how many kernels, how busy, and how long the gaps
between kernels are (a gap is where another process's work can run, or where this stream
waits on the CPU).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError

GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


@dataclass
class GpuEvent:
    kind: str  # kernel, memcpy, memset
    name: str
    device: int | None
    stream: int | None
    ts: float  # microseconds
    dur: float  # microseconds
    grid: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[i]


@dataclass
class StreamStats:
    """One stream of one device."""

    device: int | None
    stream: int | None
    kernels: int = 0
    memcpys: int = 0
    memsets: int = 0
    distinct_kernels: int = 0
    #: Time with at least one kernel/copy running on this stream, microseconds.
    busy_us: float = 0.0
    #: From the first event's start to the last event's end, microseconds.
    span_us: float = 0.0
    gaps: list[float] = field(default_factory=list, repr=False)
    #: name -> [count, total microseconds]
    by_name: dict[str, list[float]] = field(default_factory=dict, repr=False)

    @property
    def busy_fraction(self) -> float | None:
        return self.busy_us / self.span_us if self.span_us > 0 else None

    def gap_stats(self) -> dict[str, float | int | None]:
        g = sorted(self.gaps)
        return {
            "count": len(g),
            "total_us": sum(g),
            "mean_us": sum(g) / len(g) if g else None,
            "p50_us": _percentile(g, 50),
            "p99_us": _percentile(g, 99),
            "max_us": g[-1] if g else None,
        }

    def top_kernels(self, n: int = 10) -> list[dict[str, Any]]:
        return _top_kernels(self.by_name, n)

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        return {
            "device": self.device,
            "stream": self.stream,
            "kernels": self.kernels,
            "memcpys": self.memcpys,
            "memsets": self.memsets,
            "distinct_kernels": self.distinct_kernels,
            "busy_us": self.busy_us,
            "span_us": self.span_us,
            "busy_fraction": self.busy_fraction,
            "gaps": self.gap_stats(),
            "top_kernels": self.top_kernels(top),
        }


def _top_kernels(by_name: dict[str, list[float]], n: int) -> list[dict[str, Any]]:
    """The ``n`` kernels with the most GPU time, from name -> [count, total microseconds]."""
    items = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:n]
    return [
        {"name": k, "count": int(v[0]), "total_us": v[1], "mean_us": v[1] / v[0]} for k, v in items
    ]


@dataclass
class TraceSummary:
    path: str
    events: int = 0
    gpu_events: int = 0
    streams: list[StreamStats] = field(default_factory=list)
    #: name -> [count, total microseconds] over all streams
    by_name: dict[str, list[float]] = field(default_factory=dict, repr=False)
    span_us: float = 0.0

    @property
    def kernels(self) -> int:
        return sum(s.kernels for s in self.streams)

    @property
    def busy_us(self) -> float:
        return sum(s.busy_us for s in self.streams)

    def top_kernels(self, n: int = 10) -> list[dict[str, Any]]:
        return _top_kernels(self.by_name, n)

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        return {
            "path": self.path,
            "events": self.events,
            "gpu_events": self.gpu_events,
            "kernels": self.kernels,
            "distinct_kernels": len(self.by_name),
            "span_us": self.span_us,
            "busy_us": self.busy_us,
            "streams": [s.to_dict(top) for s in self.streams],
            "top_kernels": self.top_kernels(top),
        }


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any] | list[Any]:
    """Read a Chrome trace (``.json`` or gzip) and return the decoded JSON."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
            return json.load(f)
    except FileNotFoundError:
        raise UsageError(f"trace file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError, EOFError, OSError) as exc:
        raise UsageError(
            f"{path} is not a readable Chrome trace JSON ({exc}); export one with "
            "torch.profiler's prof.export_chrome_trace(PATH)"
        ) from None


def gpu_events(trace: dict[str, Any] | list[Any]) -> tuple[int, list[GpuEvent]]:
    """(total events, GPU events) of a decoded trace."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise UsageError("trace has no traceEvents list")
    out = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        kind = GPU_CATEGORIES.get(str(ev.get("cat", "")).lower())
        if kind is None:
            continue
        args = ev.get("args") or {}
        try:
            ts = float(ev["ts"])
            dur = float(ev.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        device = _int(args.get("device", ev.get("pid")))
        stream = _int(args.get("stream", ev.get("tid")))
        out.append(
            GpuEvent(
                kind=kind,
                name=str(ev.get("name", "?")),
                device=device,
                stream=stream,
                ts=ts,
                dur=max(0.0, dur),
                grid=_shape(args.get("grid")),
                block=_shape(args.get("block")),
            )
        )
    return len(events), out


def summarize(path: str | os.PathLike[str]) -> TraceSummary:
    total, evs = gpu_events(load_trace(path))
    return summarize_events(evs, path=os.fspath(path), total_events=total)


def summarize_events(
    events: list[GpuEvent], path: str = "<events>", total_events: int | None = None
) -> TraceSummary:
    summary = TraceSummary(path=path, events=total_events or len(events), gpu_events=len(events))
    by_stream: dict[tuple[int | None, int | None], list[GpuEvent]] = {}
    for ev in events:
        by_stream.setdefault((ev.device, ev.stream), []).append(ev)
    if events:
        summary.span_us = max(e.ts + e.dur for e in events) - min(e.ts for e in events)
    for (device, stream), evs in sorted(by_stream.items(), key=lambda kv: _sort_key(kv[0])):
        evs.sort(key=lambda e: e.ts)
        st = StreamStats(device=device, stream=stream)
        busy_start, busy_end = evs[0].ts, evs[0].ts + evs[0].dur
        prev_end = None
        for e in evs:
            end = e.ts + e.dur
            if e.kind == "kernel":
                st.kernels += 1
                rec = st.by_name.setdefault(e.name, [0, 0.0])
                rec[0] += 1
                rec[1] += e.dur
                allrec = summary.by_name.setdefault(e.name, [0, 0.0])
                allrec[0] += 1
                allrec[1] += e.dur
            elif e.kind == "memcpy":
                st.memcpys += 1
            else:
                st.memsets += 1
            if prev_end is not None and e.ts > prev_end:
                st.gaps.append(e.ts - prev_end)
            prev_end = end if prev_end is None else max(prev_end, end)
            # Union of intervals (events on one stream should not overlap; be safe anyway).
            if e.ts > busy_end:
                st.busy_us += busy_end - busy_start
                busy_start, busy_end = e.ts, end
            else:
                busy_end = max(busy_end, end)
        st.busy_us += busy_end - busy_start
        st.span_us = (prev_end or evs[0].ts) - evs[0].ts
        st.distinct_kernels = len(st.by_name)
        summary.streams.append(st)
    return summary


def compare(summaries: list[TraceSummary], top: int = 10) -> dict[str, Any]:
    """Case-A vs Case-B: per-trace totals, stream counts, kernels in common."""
    labels = [f"Case-{chr(ord('A') + i)}" for i in range(len(summaries))]
    rows = []

    def row(metric: str, values: list[Any]) -> None:
        rows.append({"metric": metric, "values": values})

    row("streams with GPU work", [len(s.streams) for s in summaries])
    row("devices", [sorted({st.device for st in s.streams}, key=_none_last) for s in summaries])
    row("kernels", [s.kernels for s in summaries])
    row("distinct kernels", [len(s.by_name) for s in summaries])
    row("GPU busy (ms, summed over streams)", [s.busy_us / 1e3 for s in summaries])
    row("span (ms)", [s.span_us / 1e3 for s in summaries])
    row(
        "busy / span",
        [s.busy_us / s.span_us if s.span_us else None for s in summaries],
    )
    row(
        "mean kernel (us)",
        [
            sum(v[1] for v in s.by_name.values()) / s.kernels if s.kernels else None
            for s in summaries
        ],
    )
    gaps = []
    for s in summaries:
        all_gaps = sorted(g for st in s.streams for g in st.gaps)
        gaps.append(all_gaps)
    row("gaps between kernels", [len(g) for g in gaps])
    row("gap p50 (us)", [_percentile(g, 50) for g in gaps])
    row("gap p99 (us)", [_percentile(g, 99) for g in gaps])
    names = [set(s.by_name) for s in summaries]
    common = set.intersection(*names) if names else set()
    row("kernels shared with the others", [len(common)] * len(summaries))
    return {
        "labels": labels,
        "paths": [s.path for s in summaries],
        "rows": rows,
        "shared_kernel_names": sorted(common)[:top],
        "top_kernels": [s.top_kernels(top) for s in summaries],
    }


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _shape(x: Any) -> tuple[int, ...] | None:
    if isinstance(x, list) and all(isinstance(v, int) for v in x):
        return tuple(x)
    return None


def _none_last(x: int | None) -> tuple[int, int]:
    return (1, 0) if x is None else (0, x)


def _sort_key(k: tuple[int | None, int | None]) -> tuple[tuple[int, int], tuple[int, int]]:
    return (_none_last(k[0]), _none_last(k[1]))
