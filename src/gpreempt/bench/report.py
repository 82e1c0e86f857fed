"""The Markdown report of a run: the tables of the user's test plan, from results.json alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _num(value: Any, digits: int = 2) -> str:
    if value is None or isinstance(value, str):
        return "n/a" if value is None else value
    if isinstance(value, bool):
        return str(value)
    return f"{value:.{digits}f}"


def _cell(row: Mapping[str, Any], key: str, digits: int = 2) -> str:
    """A number with its spread over repeats, e.g. ``1.02 (0.98-1.10)``."""
    parts = key.split(".")
    value: Any = row
    for part in parts:
        value = value.get(part) if isinstance(value, Mapping) else None
    text = _num(value, digits)
    spread = (row.get("spread") or {}).get(key)
    if spread and spread.get("n", 0) > 1 and spread["min"] != spread["max"]:
        text += f" ({_num(spread['min'], digits)}-{_num(spread['max'], digits)})"
    return text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def render(results: Mapping[str, Any]) -> str:
    """Markdown for one run's results.json."""
    device, params = results.get("device", {}), results.get("params", {})
    scenarios: Mapping[str, Any] = results.get("scenarios", {})
    out = ["# gpreempt bench", ""]
    out.append(
        f"Device: {device.get('name') or 'n/a'}, driver {device.get('driver') or 'n/a'}, "
        f"CUDA {device.get('cuda') or 'n/a'}, torch {device.get('torch') or 'n/a'}."
    )
    out.append(
        f"Case-A {params.get('case_a')} (service time alone S = "
        f"{_num(params.get('service_ms_alone'), 3)} ms), load {params.get('load')} "
        f"(Poisson, {_num(params.get('arrival_rate_per_s'), 1)} requests/s, seed "
        f"{params.get('seed')}), {params.get('requests')} requests; {params.get('bg')} Case-B "
        f"process(es); {params.get('repeats')} repeat(s)"
        + (" (median, spread min-max in brackets)" if (params.get("repeats") or 1) > 1 else "")
        + "."
    )
    out.append(f"Generated {results.get('generated_at', '')}; command: `{params.get('command')}`.")
    out += [
        "",
        f"## Case-A latency (ms), Case-A {params.get('case_a')}, {params.get('bg')} Case-B",
        "",
    ]
    rows = []
    for name, row in scenarios.items():
        if row.get("a_latency_ms") is None and name == "b-alone":
            continue
        rows.append(
            [name, "yes" if row.get("valid") else "**no**"]
            + [_cell(row, f"a_latency_ms.{k}") for k in ("mean", "p50", "p95", "p99", "std")]
            + [_cell(row, "a_p99_ratio")]
        )
    out += _table(["scenario", "valid", "mean", "P50", "P95", "P99", "std", "P99 ratio"], rows)
    out += ["", "## Throughput: sequential vs concurrent", ""]
    out.append(
        "Inside Case-A's window (first arrival to last completion). A served: Case-A's request "
        "rate against Case-A alone. B kept: Case-B steps/s against Case-B alone. "
        "System throughput = A served + B kept."
    )
    out.append("")
    rows = [
        [
            name,
            _cell(row, "a_served"),
            _cell(row, "b_steps_per_s", 1),
            _cell(row, "b_kept"),
            _cell(row, "system_throughput"),
        ]
        for name, row in scenarios.items()
    ]
    out += _table(["scenario", "A served", "B steps/s", "B kept", "system throughput"], rows)
    preempt = {n: r for n, r in scenarios.items() if n.startswith("gpreempt-")}
    if preempt:
        out += ["", "## Preemption (gpreempt daemon's suspend calls)", ""]
        rows = [
            [
                name,
                _cell(row, "suspensions", 0),
                _cell(row, "preempt_latency_ms.p50", 3),
                _cell(row, "preempt_latency_ms.p99", 3),
                _cell(row, "preempt_latency_ms.max", 3),
                _cell(row, "b_suspended_fraction"),
            ]
            for name, row in preempt.items()
        ]
        out += _table(
            ["scenario", "suspensions", "P50 ms", "P99 ms", "max ms", "B suspended share"], rows
        )
    out += ["", "## GPU utilisation (NVML, sampled during the window)", ""]
    rows = []
    for name, row in scenarios.items():
        gpu = row.get("gpu_util")
        if not isinstance(gpu, Mapping):
            rows.append([name, "n/a", "n/a", "n/a"])
            continue
        procs = ", ".join(
            f"{p.get('role')}: {_num(p.get('sm_util_mean'), 0)} % SM, "
            f"{_num(p.get('mem_used_mib_max'), 0)} MiB"
            for p in (gpu.get("processes") or {}).values()
        )
        rows.append(
            [
                name,
                _num(gpu.get("device_util_mean"), 0),
                _num(gpu.get("device_mem_used_mib_max"), 0),
                procs or "n/a",
            ]
        )
    out += _table(["scenario", "GPU util %", "memory used MiB (max)", "per process"], rows)
    invalid = {n: r for n, r in scenarios.items() if not r.get("valid")}
    if invalid:
        out += ["", "## Invalid scenarios (not comparable)", ""]
        out += [
            f"- `{n}`: {r.get('invalid_reason') or 'no reason recorded'}"
            for n, r in invalid.items()
        ]
    plots = results.get("plots") or []
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{p}]({p})" for p in plots]
    return "\n".join(out) + "\n"
