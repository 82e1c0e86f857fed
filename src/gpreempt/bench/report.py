"""The Markdown report of a run: the tables of the user's test plan, from results.json alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .load import describe_load_check


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


def _yes_no(value: Any, yes: str = "yes", no: str = "**no**") -> str:
    return "n/a" if value is None else (yes if value else no)


def _memory_section(scenarios: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The memory-pressure table: did Case-A get its memory, what eviction cost, did Case-B
    survive."""
    rows = {n: r for n, r in scenarios.items() if "a_oom" in r}
    if not rows:
        return []
    out = ["", "## Memory pressure (Case-A grows its working set beyond free memory)", ""]
    plan = params.get("memory_plan") or {}
    if plan:
        out.append(
            f"GPU 0 had {_num(plan.get('free_gib'), 1)} GiB free at the start. Case-B holds a "
            f"{_num(plan.get('ballast_gib'), 1)} GiB ballast beside its model; Case-A grows by "
            f"{_num(plan.get('growth_gib'), 1)} GiB (chunks of {_num(plan.get('chunk_gib'), 2)} "
            f"GiB) at the first request due {_num(plan.get('growth_at_s'), 2)} s into its window "
            f"and keeps it to the end. Under gpreempt Case-A runs with --reserve-memory "
            f"{_num(plan.get('reserve_gib'), 1)} GiB and waits up to {_num(plan.get('wait_s'), 0)}"
            " s for room; without gpreempt its growth fails at the first out-of-memory."
        )
        out.append("")
    table = []
    for name, row in rows.items():
        events = row.get("memory_events") or {}
        moves = []
        for kind in ("evict", "restore"):
            item = events.get(kind) if isinstance(events, Mapping) else None
            moves.append(
                "n/a"
                if not item
                else f"{_num(item.get('count'), 0)} / {_num(item.get('gib'), 1)} / "
                f"{_num(item.get('seconds'), 2)} / {_num(item.get('gb_per_s'), 1)}"
            )
        table.append(
            [
                name,
                "yes" if row.get("valid") else "**no**",
                _yes_no(None if row.get("a_oom") is None else not row["a_oom"], no="**no (OOM)**"),
                _cell(row, "a_growth_gib", 1),
                _cell(row, "a_free_before_growth_gib", 1),
                _cell(row, "a_growth_request_ms", 1),
                _cell(row, "a_latency_ms.p99", 3),
                *moves,
                _num(row.get("b_exit_code"), 0) if row.get("b_exit_code") is not None else "n/a",
                _cell(row, "b_steps_after_restore", 0),
                _yes_no(row.get("b_survived")),
            ]
        )
    out += _table(
        [
            "scenario",
            "valid",
            "A got its memory",
            "A grew GiB",
            "free before GiB",
            "growth request ms",
            "A P99 ms",
            "evict n / GiB / s / GB/s",
            "restore n / GiB / s / GB/s",
            "B exit code",
            "B steps after restore",
            "B survived",
        ],
        table,
    )
    notes = [f"- `{n}`: {note}" for n, r in rows.items() for note in r.get("memory_notes") or []]
    notes += [
        f"- `{n}`: daemon error: {error}"
        for n, r in rows.items()
        for error in r.get("memory_errors") or []
    ]
    if notes:
        out += ["", *notes]
    out += [
        "",
        "B steps after restore: Case-B's steps completed after its restore (baseline: after "
        "Case-A's window), in the seconds before it was stopped. B survived: exit code 0 and "
        "steps after restore.",
    ]
    return out


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
        f"Case-A {params.get('case_a')} (mean service time alone at this load S = "
        f"{_num(params.get('service_ms_alone'), 3)} ms), load {params.get('load')} "
        f"(Poisson, {_num(params.get('arrival_rate_per_s'), 1)} requests/s, seed "
        f"{params.get('seed')}), {params.get('requests')} requests; {params.get('bg')} Case-B "
        f"process(es); {params.get('repeats')} repeat(s)"
        + (" (median, spread min-max in brackets)" if (params.get("repeats") or 1) > 1 else "")
        + "."
    )
    checked = describe_load_check(params.get("load_check"), params.get("arrival_rate_per_s"))
    if checked:
        out.append(checked)
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
        "System throughput = A served + B kept. A busy: share of the window Case-A was serving "
        "(the load it really put on the GPU); B kept of idle = B kept / (1 - A busy). B late: "
        "Case-B steps completed more than 1.5 of its steps into a period in which the daemon "
        "counted Case-A active (gpreempt scenarios)."
    )
    out.append("")
    rows = [
        [
            name,
            _cell(row, "a_served"),
            _cell(row, "b_steps_per_s", 1),
            _cell(row, "b_kept"),
            _cell(row, "system_throughput"),
            _cell(row, "a_busy"),
            _cell(row, "b_kept_of_idle"),
            _cell(row, "b_late_steps", 0),
        ]
        for name, row in scenarios.items()
    ]
    out += _table(
        [
            "scenario",
            "A served",
            "B steps/s",
            "B kept",
            "system throughput",
            "A busy",
            "B kept of idle",
            "B late",
        ],
        rows,
    )
    preempt = {
        n: r for n, r in scenarios.items() if n.startswith("gpreempt-") or "suspensions" in r
    }
    if preempt:
        out += ["", "## Preemption (gpreempt daemon's suspend calls)", ""]
        if "gpreempt-scheduler" in preempt:
            out.append(
                "gpreempt-scheduler has no daemon: its B suspended share is the scheduler's own "
                "accounting; it makes no suspend calls to time."
            )
            out.append("")
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
    out += _memory_section(scenarios, params)
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
    leaked = {n: r for n, r in scenarios.items() if r.get("hold_leaks")}
    if leaked:
        out += ["", "## Suspensions that did not hold", ""]
        out += [
            f"- `{n}`: {r['hold_leaks']} found by the daemon, {r.get('backstop_stops', 0)} "
            "stopped behind them (`events.jsonl` of its runs)"
            for n, r in leaked.items()
        ]
    plots = results.get("plots") or []
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{p}]({p})" for p in plots]
    return "\n".join(out) + "\n"
