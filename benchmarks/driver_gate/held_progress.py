"""Did a trainer's GPU work go on while the server was active? Read from one bench run.

A trainer behind stream barriers may finish only the step the GPU was running when the server
became active: a step that completes later than one step's time into an active period ran
while it should have been held. This reads one scenario's run folder of ``gpreempt bench``
(``runs/rN/SCENARIO``: the server's requests ``case-a.json``, the first trainer's step ends
``case-b-0.json``, the daemon's ``events.jsonl``; each may be gzipped) and prints:

* the trainer's steps that completed inside the server's active periods (from the daemon's
  ``active``/``idle`` events), and how far into the period, against its median step time;
* the service time of requests that queued behind the previous one, split by whether the
  server went idle in between: a server that stays active should serve them as fast as alone;
* the requests that took more than twice the run's median service time, how many of them came
  in stretches (one right after another), the longest request, and the trainer's longest step
  over such a stretch: a stretch of slow requests with a trainer that makes no progress is not
  its work going on, but the GPU or the CPU shared with something else;
* how long the daemon took from the server's ``active`` event to the trainer's ``suspend``
  (median and longest): a long one beside a slow request points at the machine's CPU side
  (the daemon uses no GPU), not at a GPU shared with held work;
* where the server kept each request's GPU span (``gpu_ms``: the graph server does), that of
  the slow requests, of the others that found the server idle and of those that queued, and
  the rest of their service: a request whose span stretched shared the GPU while it ran; one
  whose span did not waited to start;
* how long each of the daemon's suspend calls took (its own CPU time, no GPU) during the slow
  requests, against the others: a call that took longer beside a slow request says the
  machine's CPUs were slow to run the daemon then, not only the GPU slow to serve the server;
* with ``--clocks FILE`` (``gpu_clocks.py``'s samples over the run), the GPU's SM clock, its
  power and its clock-event reasons while the slow requests ran, against the others that
  found the server idle and those that queued: a slow request at full clock, no reason given,
  met other work, not a slower GPU, and a queued request served slower than alone at a lower
  clock ran on a GPU the trainer's earlier work left slower, not beside that work; and the
  host's runnable tasks, the share of the time some task waited for a CPU and the CPU time
  stolen by the hypervisor, for the same split, and the sampler's own timings (its period, how
  late its sleep woke, its NVML reads, a fixed piece of CPU work).

With ``--around-longest MS``, what happened within MS of the start of the run's longest-served
request, in ms from that start: the requests that started then (when each arrived and ended,
and its GPU span), the daemon's events and the trainer's step ends. A request stretched because
its own process stood still shows its first ``active`` late, and a trainer that stood still
too completes no step through it, though nothing held it.

Without ``events.jsonl`` (a run kept without it), or without a trainer (the server's runs
alone, ``a-alone``, read for their slow requests and the host beside them), only the slow
requests, their GPU spans and the samples are printed.

    python3 benchmarks/driver_gate/held_progress.py [--json] [--grace-ms MS] [--clocks FILE]
        [--around-longest MS] RUN_FOLDER...
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from gpreempt.bench import daemon_events, scenario_metrics
from gpreempt.config import DEFAULT_IDLE_GRACE_MS, DEFAULT_REQUEST_LINGER_MS, ENV_GRACE_MS


def _read(folder: Path, name: str, required: bool = True) -> Any:
    plain, packed = folder / name, folder / f"{name}.gz"
    if plain.exists():
        text = plain.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        text = ""
    if not text.strip() and not required:
        return None
    if not text.strip():
        if name.startswith("case-b"):
            raise SystemExit(
                f"held_progress: {folder} holds no trainer's steps ({name}): a "
                "trainer run as a command writes none"
            )
        raise SystemExit(f"held_progress: {folder} has no {name}: give a runs/rN/SCENARIO folder")
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _split(count: int, slow: list[int]) -> dict[str, list[int]]:
    """The indices of ``count`` requests, the slow ones and the others."""
    marked = set(slow)
    return {
        "slow": [i for i in range(count) if i in marked],
        "other": [i for i in range(count) if i not in marked],
    }


def slow_stretches(
    server: dict[str, Any], trainer: dict[str, Any], slow: list[int]
) -> dict[str, Any]:
    """The slow requests (``slow``, by ``scenario_metrics.slow_requests``: over twice the run's
    median service time); those of them that queued behind the one before (the trainer
    already held when they started); those in stretches (``scenario_metrics.slow_stretch``);
    the trainer's longest step that overlaps one (ms)."""
    service = scenario_metrics.a_service_ms(server)
    stretched = scenario_metrics.slow_stretch(server)
    idle = scenario_metrics.found_idle(server)
    s = server["start"]
    ends = trainer["step_end_t"]
    longest = 0.0
    for a, b in zip(ends, ends[1:], strict=False):
        if any(a < s[i] < b for i in stretched):
            longest = max(longest, (b - a) * 1e3)
    return {"limit_ms": scenario_metrics.slow_limit_ms(service), "slow": len(slow),
            "queued": sum(1 for i in slow if not idle[i]), "in_stretches": len(stretched),
            "longest_step_ms": longest,
            "longest_request_ms": max(service, default=0.0)}  # fmt: skip


def request_kinds(server: dict[str, Any], slow: list[int], count: int) -> dict[str, list[int]]:
    """The indices of the first ``count`` requests: the slow ones, the others that found the
    server idle (a trainer's work in flight, the GPU's switch) and the others that queued
    behind the one before (the trainer held all along)."""
    idle = scenario_metrics.found_idle(server)
    rows = _split(min(count, len(idle)), slow)
    rows["found idle"] = [i for i in rows["other"] if idle[i]]
    rows["queued"] = [i for i in rows.pop("other") if not idle[i]]
    return rows


def gpu_spans(server: dict[str, Any], slow: list[int]) -> dict[str, Any]:
    """For each of :func:`request_kinds`: how many, the median of their GPU spans (``gpu_ms``)
    and of the rest of their service, the time outside the span (ms). A request that found the
    server idle meets a trainer's work in flight: outside its span if it waited for that work
    to leave the GPU, inside if the work shared the GPU with it (or left it colder)."""
    service, spans = scenario_metrics.a_service_ms(server), server["gpu_ms"]
    rows = request_kinds(server, slow, min(len(service), len(spans)))
    return {
        kind: {
            "n": len(chosen),
            "gpu_p50": _q([spans[i] for i in chosen], 0.5),
            "outside_p50": _q([service[i] - spans[i] for i in chosen], 0.5),
        }
        for kind, chosen in rows.items()
    }


def read_clocks(path: Path) -> list[list[float]]:
    """``gpu_clocks.py``'s samples (a JSON array a line, the file gzipped or not), by time."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
    try:
        samples = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as error:
        raise SystemExit(f"held_progress: {path} is not gpu_clocks.py's output ({error})") from None
    return sorted(samples)


def _samples_during(
    server: dict[str, Any], samples: list[list[Any]], slow: list[int]
) -> dict[str, list[int]]:
    """The indices of the samples (by time) taken while a request of each of
    :func:`request_kinds` ran; those taken between requests in none. The queued requests ran
    while the trainer was held: a GPU slower for them than alone (a lower clock, less power
    left) is no work of the trainer's."""
    s, e = server["start"], server["end"]
    count = min(len(s), len(e))
    kind_of = {i: kind for kind, rows in request_kinds(server, slow, count).items() for i in rows}
    starts = sorted(range(count), key=lambda i: s[i])
    begins = [s[i] for i in starts]
    found: dict[str, list[int]] = {"slow": [], "found idle": [], "queued": []}
    for k, sample in enumerate(samples):
        j = bisect.bisect_right(begins, sample[0]) - 1  # the last request started by then
        if j >= 0 and sample[0] <= e[starts[j]] and starts[j] in kind_of:
            found[kind_of[starts[j]]].append(k)
    return found


def clocks_during(
    server: dict[str, Any], samples: list[list[float]], slow: list[int]
) -> dict[str, Any]:
    """The samples taken while the requests of each kind ran (:func:`_samples_during`): how
    many, the SM clock's median and lowest (MHz), the power's median (W, the driver's own
    average) and the clock-event reasons seen (NVML's bitmask values)."""
    return {
        kind: {
            "samples": len(rows),
            "sm_mhz_p50": _q([samples[k][1] for k in rows], 0.5),
            "sm_mhz_min": min((samples[k][1] for k in rows), default=float("nan")),
            "power_w_p50": _q([samples[k][2] / 1e3 for k in rows], 0.5),
            "reasons": sorted({int(samples[k][4]) for k in rows}),
        }
        for kind, rows in _samples_during(server, samples, slow).items()
    }


def _rate(counted: tuple[list[float], list[float]], scale: float) -> float:
    """A counter's growth per second of the samples' time, times ``scale``; NaN without any."""
    deltas, walls = counted
    return scale * sum(deltas) / sum(walls) if sum(walls) else float("nan")


def host_during(
    server: dict[str, Any], samples: list[list[Any]], slow: list[int]
) -> dict[str, Any]:
    """The host's CPU contention (``gpu_clocks.py``'s host fields) while the slow requests ran
    and while the others did: the median of the runnable tasks, the share of the time some
    runnable task waited for a CPU, the CPU time stolen and the time the sampler's cgroup was
    throttled (ms per second, all CPUs), from each sample taken in a request and the one
    before it; and the sampler's own period by the median, which grows where the CPU side
    slows for every process, the sampler's among them, with its parts: how late its sleep
    woke, how long its NVML reads took and how long its fixed piece of CPU work took (the
    medians; ``gpu_clocks.py``). NaN where the samples do not say (an older file, a kernel
    without pressure stall information, no cgroup CPU controller)."""
    out: dict[str, Any] = {}
    for kind, rows in _samples_during(server, samples, slow).items():
        runnable, period_s = [], []
        timed: dict[int, list[float]] = {10: [], 11: [], 12: []}
        counted: dict[int, tuple[list[float], list[float]]] = {f: ([], []) for f in (7, 8, 9)}
        for k in rows:
            sample, before = samples[k], samples[k - 1]
            if k == 0 or len(sample) < 9 or len(before) < 9:
                continue
            period_s.append(sample[0] - before[0])
            if sample[6] is not None:
                runnable.append(sample[6])
            for field, values in timed.items():
                if len(sample) > field and sample[field] is not None:
                    values.append(sample[field])
            for field, (deltas, walls) in counted.items():
                if len(sample) > field and sample[field] is not None and before[field] is not None:
                    deltas.append(sample[field] - before[field])
                    walls.append(sample[0] - before[0])
        out[kind] = {
            "samples": len(period_s),
            "runnable_p50": _q(runnable, 0.5),
            "cpu_wait_share": _rate(counted[7], 1e-6),
            "steal_ms_per_s": _rate(counted[8], 1e3),
            "throttled_ms_per_s": _rate(counted[9], 1e3),
            "sampler_period_ms_p50": 1e3 * _q(period_s, 0.5),
            "sleep_late_ms_p50": _q(timed[10], 0.5),
            "nvml_read_ms_p50": _q(timed[11], 0.5),
            "cpu_probe_us_p50": _q(timed[12], 0.5),
        }
    return out


def suspend_calls(
    events: list[dict[str, Any]], server: dict[str, Any], slow: list[int]
) -> dict[str, Any]:
    """How long the daemon's suspend calls (``latency_ms`` of each ``suspend`` event) took
    when made during a slow request or up to 1 ms before it, and the others: how many, median
    and longest (ms)."""
    s, e = server["start"], server["end"]
    windows = sorted((s[i] - 1e-3, e[i]) for i in slow)
    begins = [w[0] for w in windows]
    calls: dict[str, list[float]] = {"slow": [], "other": []}
    for event in events:
        if event.get("event") != "suspend" or event.get("latency_ms") is None:
            continue
        t = event.get("t", 0.0)
        j = bisect.bisect_right(begins, t) - 1
        near = j >= 0 and t <= windows[j][1]
        calls["slow" if near else "other"].append(float(event["latency_ms"]))
    return {
        k: {"n": len(v), "p50": _q(v, 0.5), "max": max(v, default=float("nan"))}
        for k, v in calls.items()
    }


def run_grace_ms(folder: Path, default: float = DEFAULT_IDLE_GRACE_MS) -> float:
    """The server's idle grace in the bench run that ``folder`` is of: the
    ``GPREEMPT_IDLE_GRACE_MS`` its ``results.json`` records for Case-A (``params.env_a``, else
    ``params.env``), found beside ``folder`` (the layout ``run.sh`` keeps, ``rN-SCENARIO``) or
    above ``runs/rN/SCENARIO`` (the bench's own); else ``default`` (a bench older than
    ``params.env_a`` recorded no ``--env-a``)."""
    above = folder.resolve().parents
    for results in [above[i] / "results.json" for i in (0, 2) if i < len(above)]:
        if not results.is_file():
            continue
        try:
            params = json.loads(results.read_text()).get("params", {})
            env = {**params.get("env", {}), **params.get("env_a", {})}
            return float(env.get(ENV_GRACE_MS, default))
        except (ValueError, AttributeError):
            break  # not a bench's results: the default
    return default


def late_after_a_gap(
    ends: list[float],
    periods: list[tuple[float, float]],
    step_s: float,
    server: dict[str, Any],
    grace_ms: float = DEFAULT_IDLE_GRACE_MS,
) -> int:
    """Of the late steps (``daemon_events.late_steps_in``), those whose active period holds,
    before the step completed, a gap between two requests longer than the idle grace
    (``grace_ms``, the run's): there the server's words dropped and the trainer rightly ran,
    though the daemon's events, which are coarser, show one period. Its requests are timed on
    the host, a little wider than its words stay raised."""
    grace = grace_ms / 1e3
    pairs = zip(server["end"], server["start"][1:], strict=False)
    gaps = [(a, b) for a, b in pairs if b - a > grace]  # (one request's end, the next's start)
    gap_ends = [a for a, _ in gaps]
    count = 0
    for t, (begin, _) in daemon_events.late_steps_in(ends, periods, step_s):
        j = bisect.bisect_right(gap_ends, begin)  # the first gap opened in the period
        count += j < len(gaps) and gaps[j][1] < t
    return count


def held_spans(
    server: dict[str, Any], ends: list[float], join_ms: float, step_ms: float = float("nan")
) -> dict[str, Any]:
    """Whether the trainer stood still while the server was busy, read from the two processes'
    own clocks, not the daemon's: the server's requests joined across gaps of at most
    ``join_ms`` (the linger of a server that marks its requests, else the idle grace: shorter
    gaps never drop its words) make its busy spans; a held trainer completes inside one at most
    what was in flight or queued before its barrier when the span began, so the steps
    completed inside each, and how far into its span the last of several came, tell a hold
    that holds (a second one early, if at all) from one that leaks (steps on through long
    spans). Steps are stamped on the host as each completes, and a stalled host stamps
    several at once: ``most_steps_paced`` counts stamps less than a quarter of the median
    step (``step_ms``) after the one before as that one, the steps the GPU could have run."""
    spans: list[list[float]] = []
    for start, stop in zip(server["start"], server["end"], strict=True):
        if spans and start - spans[-1][1] <= join_ms / 1e3:
            spans[-1][1] = max(spans[-1][1], stop)
        else:
            spans.append([start, stop])
    counts, paced, last_of_several = [], [], []
    burst_s = step_ms / 4e3 if step_ms == step_ms else 0.0  # NaN: none told apart
    for start, stop in spans:
        inside = ends[bisect.bisect_right(ends, start) : bisect.bisect_right(ends, stop)]
        counts.append(len(inside))
        gaps = [b - a for a, b in zip(inside, inside[1:], strict=False)]
        paced.append(min(len(inside), 1 + sum(gap >= burst_s for gap in gaps)))
        if len(inside) > 1:
            last_of_several.append((inside[-1] - start) * 1e3)
    return {
        "n": len(spans),
        "join_ms": join_ms,
        "most_steps": max(counts, default=0),
        "most_steps_paced": max(paced, default=0),
        "last_of_several_ms": max(last_of_several, default=float("nan")),
    }


def reaction_ms(events: list[dict[str, Any]], begin: float, end: float) -> dict[str, float]:
    """From each ``active`` event of the server between ``begin`` and ``end`` to the first
    ``suspend`` of a trainer after it, before the server's next ``idle``: median and longest
    (ms; NaN where none)."""
    ordered = sorted(events, key=lambda e: e.get("t", 0.0))
    lags, since = [], None
    for event in ordered:
        kind, task, t = event.get("event"), str(event.get("task", "")), event.get("t", 0.0)
        if task == "case-a" and kind == "active" and begin <= t <= end:
            since = t
        elif task == "case-a" and kind == "idle":
            since = None
        elif since is not None and kind == "suspend" and task.startswith("case-b"):
            lags.append((t - since) * 1e3)
            since = None
    return {"p50": _q(lags, 0.5), "max": max(lags, default=float("nan")), "n": len(lags)}


def around_longest(
    server: dict[str, Any], ends: list[float], events: list[dict[str, Any]], window_ms: float
) -> dict[str, Any]:
    """The run's longest-served request and, within ``window_ms`` of its start, the requests
    that started, the daemon's events and the trainer's step ends, as (ms from its start, what)
    in time order; with the medians to read them against (service, GPU span, step)."""
    start, end = server["start"], server["end"]
    i = max(range(len(start)), key=lambda j: end[j] - start[j])
    t0, w = start[i], window_ms / 1e3
    gpu = server.get("gpu_ms")
    rows: list[tuple[float, str]] = []
    for j, (arrived, began, ended) in enumerate(zip(server["scheduled"], start, end, strict=True)):
        if abs(began - t0) <= w:
            span = f", GPU span {gpu[j]:.3f}" if gpu else ""
            times = f"arrived {(arrived - t0) * 1e3:.3f}, ends {(ended - t0) * 1e3:.3f}"
            rows.append(((began - t0) * 1e3, f"request {j} starts ({times}{span})"))
    rows += [((e["t"] - t0) * 1e3, f"{e.get('task')} {e.get('event')}") for e in events
             if abs(e.get("t", 0.0) - t0) <= w]  # fmt: skip
    rows += [((t - t0) * 1e3, "trainer step ends") for t in ends if abs(t - t0) <= w]
    steps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {
        "request": i,
        "service_ms": (end[i] - t0) * 1e3,
        "service_p50_ms": _q([(b - a) * 1e3 for a, b in zip(start, end, strict=True)], 0.5),
        "gpu_p50_ms": _q(list(gpu), 0.5) if gpu else float("nan"),
        "step_p50_ms": _q(steps, 0.5) * 1e3 if steps else float("nan"),
        "timeline": sorted(rows),
    }


def summary(
    folder: Path,
    grace_ms: float | None = None,
    clocks: list[list[float]] | None = None,
    around_ms: float | None = None,
) -> dict[str, Any]:
    """The figures printed by :func:`main`, as a dict (``None`` for those that need the
    daemon's events where the folder has none); ``grace_ms``: the server's idle grace where
    the run's ``results.json`` does not say it (:func:`run_grace_ms`); ``clocks``: the GPU's
    samples over the run (:func:`read_clocks`), if any; ``around_ms``: the window of
    :func:`around_longest`, if wanted."""
    server = _read(folder, "case-a.json")
    alone = not any((folder / f).exists() for f in ("case-b-0.json", "case-b-0.json.gz"))
    trainer = {"step_end_t": []} if alone else _read(folder, "case-b-0.json")
    every = trainer["step_end_t"]
    gaps = [b - a for a, b in zip(every, every[1:], strict=False)]
    step_s = statistics.median(gaps) if gaps else float("nan")
    slow = scenario_metrics.slow_requests(server)
    result: dict[str, Any] = {
        "step_ms": step_s * 1e3,
        "slow": slow_stretches(server, trainer, slow),
    }
    if server.get("gpu_ms"):
        result["gpu_ms"] = gpu_spans(server, slow)
    if clocks is not None:
        result["clocks"] = clocks_during(server, clocks, slow)
        result["host"] = host_during(server, clocks, slow)
    events = _read(folder, "events.jsonl", required=False)
    if events is None or alone:
        return result
    begin, end = server["start"][0], server["end"][-1]
    grace_ms = run_grace_ms(folder, DEFAULT_IDLE_GRACE_MS if grace_ms is None else grace_ms)
    periods = daemon_events.active_periods(events, "case-a", end)
    ends = [t for t in every if begin <= t <= end]
    inside = daemon_events.late_steps(ends, periods, 0.0)  # every step inside a period
    active_s = sum(min(b, end) - max(a, begin) for a, b in periods if b > begin and a < end)
    idle_ends = [p[1] for p in periods]
    split: dict[str, list[float]] = {"stayed active": [], "went idle between": []}
    s, e = server["start"], server["end"]
    for i in range(1, len(s)):
        if s[i] > e[i - 1] + 1e-4:
            continue  # it did not queue: the server was idle when it came
        j = bisect.bisect_left(idle_ends, e[i - 1] - 5e-4)
        went_idle = j < len(idle_ends) and idle_ends[j] < s[i] + 3e-4
        split["went idle between" if went_idle else "stayed active"].append((e[i] - s[i]) * 1e3)
    if around_ms is not None:
        result["around_longest"] = around_longest(server, sorted(every), events, around_ms)
    return {
        **result,
        "active_share": active_s / (end - begin),
        "steps": len(ends),
        "steps_in_active": len(inside),
        "steps_past_one_step": len(daemon_events.late_steps(ends, periods, step_s)),
        "idle_grace_ms": grace_ms,
        "late_after_a_gap": late_after_a_gap(ends, periods, step_s, server, grace_ms),
        "held_spans": held_spans(
            server,
            sorted(ends),
            DEFAULT_IDLE_GRACE_MS
            if folder.name.endswith("no-request")
            else DEFAULT_REQUEST_LINGER_MS,
            step_s * 1e3,
        ),
        "reaction_ms": reaction_ms(events, begin, end),
        "suspend_calls_ms": suspend_calls(events, server, slow),
        "queued_service_ms": {
            k: {"n": len(v), "p50": _q(v, 0.5), "p90": _q(v, 0.9)} for k, v in split.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folders", type=Path, nargs="+", help="runs/rN/SCENARIO folders of gpreempt bench"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument(
        "--grace-ms",
        type=float,
        help="the server's idle grace (ms) where a run's results.json does not say it "
        f"(default {DEFAULT_IDLE_GRACE_MS})",
    )
    parser.add_argument(
        "--clocks", type=Path, help="gpu_clocks.py's samples taken over the runs (gzipped or not)"
    )
    parser.add_argument(
        "--around-longest",
        type=float,
        metavar="MS",
        help="what happened within MS of the start of each run's longest-served request",
    )
    args = parser.parse_args(argv)
    clocks = read_clocks(args.clocks) if args.clocks else None
    summaries = {
        str(f): summary(f, args.grace_ms, clocks, args.around_longest) for f in args.folders
    }
    if args.json:
        print(json.dumps(summaries, indent=1))
        return 0
    for folder, r in summaries.items():
        if len(summaries) > 1:
            print(f"{folder}:")
        _print(r)
    return 0


def _print(r: dict[str, Any]) -> None:
    if "active_share" in r:
        print(
            f"server active {r['active_share']:.2f} of the time; trainer step {r['step_ms']:.2f} ms"
        )
        print(
            f"trainer steps completed: {r['steps']}, inside active periods "
            f"{r['steps_in_active']}, of them more than 1.5 steps into the period: "
            f"{r['steps_past_one_step']} ({r['late_after_a_gap']} after a gap between two "
            f"requests longer than the idle grace, {r['idle_grace_ms']:g} ms)"
        )
        for k, v in r["queued_service_ms"].items():
            print(f"queued requests, server {k}: n={v['n']} service p50 {v['p50']:.2f} ms, "
                  f"p90 {v['p90']:.2f} ms")  # fmt: skip
        h = r["held_spans"]
        print(f"the server's busy spans (its requests joined across gaps up to {h['join_ms']:g} "
              f"ms): {h['n']}; most trainer steps completed inside one: {h['most_steps']} "
              f"({h['most_steps_paced']} at the GPU's pace: stamps closer than a quarter "
              f"step as one), the last of several {h['last_of_several_ms']:.2f} ms in at "
              "most")  # fmt: skip
        lag = r["reaction_ms"]
        print(f"the daemon's suspend after the server's active: median {lag['p50']:.2f} ms, "
              f"longest {lag['max']:.2f} ms (n={lag['n']})")  # fmt: skip
        for kind, c in r["suspend_calls_ms"].items():
            print(f"the daemon's suspend calls during the {kind} requests: n={c['n']}, median "
                  f"{c['p50']:.3f} ms, longest {c['max']:.3f} ms")  # fmt: skip
    if "around_longest" in r:
        a = r["around_longest"]
        print(f"around the longest-served request ({a['request']}, {a['service_ms']:.2f} ms; "
              f"medians: service {a['service_p50_ms']:.2f} ms, GPU span {a['gpu_p50_ms']:.2f} "
              f"ms, trainer step {a['step_p50_ms']:.2f} ms), ms from its start:")  # fmt: skip
        for t, what in a["timeline"]:
            print(f"  {t:9.3f}  {what}")
    slow = r["slow"]
    trainer = (
        f"; the trainer's longest step over one {slow['longest_step_ms']:.0f} ms (its median "
        f"{r['step_ms']:.0f})"
        if not math.isnan(r["step_ms"])  # a trainer ran
        else ""
    )
    print(
        f"requests over {slow['limit_ms']:.2f} ms (twice the median service): {slow['slow']} "
        f"({slow['queued']} queued behind another), in stretches {slow['in_stretches']}, the "
        f"longest {slow['longest_request_ms']:.1f} ms{trainer}"
    )
    for kind, g in r.get("gpu_ms", {}).items():
        print(f"GPU span of the {kind} requests (n={g['n']}): median {g['gpu_p50']:.2f} ms, "
              f"the rest of their service {g['outside_p50']:.2f} ms")  # fmt: skip
    for kind, c in r.get("clocks", {}).items():
        print(f"GPU while the {kind} requests ran: {c['samples']} samples, SM clock median "
              f"{c['sm_mhz_p50']:g} MHz, lowest {c['sm_mhz_min']:g}, power median "
              f"{c['power_w_p50']:g} W, clock-event reasons {c['reasons']}")  # fmt: skip
    host = r.get("host", {})
    for kind, h in host.items() if any(h["samples"] for h in host.values()) else ():
        print(f"host while the {kind} requests ran: {h['samples']} samples, runnable tasks "
              f"median {h['runnable_p50']:g}, some task waiting for a CPU "
              f"{100 * h['cpu_wait_share']:.1f} % of the time, stolen "
              f"{h['steal_ms_per_s']:.1f} ms/s, throttled {h['throttled_ms_per_s']:.1f} ms/s, "
              f"the sampler's period {h['sampler_period_ms_p50']:.1f} ms (woke "
              f"{h['sleep_late_ms_p50']:.2f} ms late, NVML reads {h['nvml_read_ms_p50']:.2f} "
              f"ms, CPU probe {h['cpu_probe_us_p50']:.0f} us)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
