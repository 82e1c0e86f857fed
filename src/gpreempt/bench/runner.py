"""A whole benchmark run: calibrate Case-A, fix the arrivals, run every scenario (and repeat),
then write results.json, report.md and the plots into the run's directory.

Several built-in Case-B kinds may share one run (``BenchConfig.case_b_kinds``): Case-A is then
calibrated once and measured alone once before and once after each repeat, each trainer's
own scenarios in between; each trainer gets a directory of its own, named after its kind, with
a results.json that reads as if it had run alone (its references are the shared runs). A kind
may carry settings of its own (``transformer-sync+GPREEMPT_DRIVER_GATE=0``): two settings of one
trainer then compare side by side, repeat by repeat, against the same runs alone."""

from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import UsageError
from .load import arrival_rate, poisson_arrivals
from .load_check import check_load
from .memory_pressure import MemoryPlan, make_plan, probe_gpu
from .plots import all_plots
from .report import render
from .scenario_catalog import (
    A_AFTER,
    ALL_SCENARIOS,
    CASE_A_ONLY,
    DEFAULT_SCENARIOS,
    MEMORY_SCENARIOS,
    check_scenarios,
)
from .scenario_metrics import b_rate, combine_memory_flags, scenario_metrics, sequential_metrics
from .scenarios import Harness, RawScenario, calibrate, run_scenario
from .stats import combine_repeats, latency_summary
from .workload_argv import Workloads

REFERENCES = ("a-alone", "b-alone")


@dataclass(frozen=True)
class BenchConfig:
    """Everything one run depends on (all of it is recorded in results.json's params)."""

    out_dir: Path
    load: float = 0.5
    requests: int = 1000
    bg: int = 1
    case_a: str = "light"  # light (batch 8) | heavy (batch 64) | custom (case_a_fn)
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS
    repeats: int = 1
    seed: int = 0
    quick: bool = False
    calibrate_requests: int = 200
    check_load: bool = True  # correct the rate from a run of Case-A alone (.load_check)
    workloads: Workloads = field(default_factory=Workloads)
    gpreempt: tuple[str, ...] = (sys.executable, "-m", "gpreempt")
    mps_control: str = "nvidia-cuda-mps-control"
    nvml: bool = True
    serve_args: tuple[str, ...] = ()  # extra options for the scenarios' private daemon
    probe_device: bool = True
    #: Built-in Case-B kinds measured in one run, against the same Case-A runs alone, each
    #: ``KIND`` or ``KIND+NAME=VALUE[+NAME=VALUE...]`` (environment variables of that trainer's
    #: processes, see :func:`trainer_spec`); empty: just ``workloads``' own Case-B. (A
    #: ``case_b_fn`` or ``case_b_cmd`` in ``workloads`` replaces every kind's trainer;
    #: ``gpreempt bench`` refuses that combination.)
    case_b_kinds: tuple[str, ...] = ()
    command: str = ""
    # memory scenarios (None: derived from GPU 0's free memory, see gpreempt.bench.memory_pressure)
    ballast_gib: float | None = None
    growth_gib: float | None = None
    reserve_gib: float | None = None
    growth_at_s: float | None = None
    memory_settle_s: float = 3.0
    memory_probe: Callable[[], dict[str, Any]] | None = None  # default: probe_gpu()

    def check(self) -> None:
        if self.requests < 20:
            raise UsageError(
                f"--requests must be at least 20 (P99 needs many), got {self.requests}"
            )
        if self.bg < 1:
            raise UsageError(f"--bg must be at least 1, got {self.bg}")
        if self.repeats < 1:
            raise UsageError(f"--repeats must be at least 1, got {self.repeats}")
        arrival_rate(self.load, 1.0)  # checks the range
        check_scenarios(self.scenarios)
        if len(self.case_b_kinds) != len(set(self.case_b_kinds)):
            raise UsageError(f"a Case-B kind is named twice: {','.join(self.case_b_kinds)}")
        for spec in self.case_b_kinds:
            trainer_spec(spec)
        make_plan({}, 1.0, self.ballast_gib, self.growth_gib, self.reserve_gib, self.growth_at_s)


def assignments(items: Sequence[str], where: str) -> tuple[tuple[str, str], ...]:
    """``NAME=VALUE`` words as pairs; UsageError, naming ``where``, for a word without ``=``
    or a name."""
    pairs = []
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise UsageError(f"{where}: {item!r} is not NAME=VALUE")
        pairs.append((name.strip(), value))
    return tuple(pairs)


def trainer_spec(spec: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A ``--case-b`` entry's kind and its own settings: ``KIND+NAME=VALUE+...`` -> (KIND,
    ((NAME, VALUE), ...)). A setting without ``=`` or a name is a usage error."""
    kind, *settings = spec.split("+")
    where = f"--case-b {spec!r} (KIND+NAME=VALUE, e.g. transformer-sync+GPREEMPT_DRIVER_GATE=0)"
    return kind.strip(), assignments(settings, where)


def scenario_order(names: Sequence[str]) -> list[str]:
    """The references first (always measured: every ratio needs them), then the rest in the
    canonical order; ``sequential`` is derived, not run."""
    wanted = set(names) | set(REFERENCES)
    if wanted - {*REFERENCES, "sequential", A_AFTER}:
        wanted.add(A_AFTER)  # something shares the GPU: how far Case-A alone drifted meanwhile
    return [n for n in ALL_SCENARIOS if n in wanted]


def run_bench(config: BenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run everything and write the outputs; returns the results.json content (with several
    Case-B kinds, the first one's; each one's is in its directory).

    SIGTERM is turned into SystemExit while it runs, so a killed run still stops every process
    it started (and any MPS daemon) on the way out.
    """
    config.check()
    previous = _exit_on_sigterm()
    try:
        return _run_bench(config, progress)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None

    def leave(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, leave)


@dataclass(frozen=True)
class _Trainer:
    """One Case-B of a run: its label (its kind in a shared run, else empty), its workloads and
    the directory its scenarios and results go to."""

    label: str
    workloads: Workloads
    out: Path


def _trainers(config: BenchConfig) -> list[_Trainer]:
    """The run's trainers: its one Case-B in the run's directory, or each of several kinds in
    a directory of its own, named after its ``--case-b`` entry."""

    def workloads_of(spec: str) -> Workloads:
        kind, settings = trainer_spec(spec)
        return replace(
            config.workloads, case_b_kind=kind, env_b=(*config.workloads.env_b, *settings)
        )

    if len(config.case_b_kinds) <= 1:
        workloads = config.workloads
        if config.case_b_kinds:
            workloads = workloads_of(config.case_b_kinds[0])
        return [_Trainer("", workloads, config.out_dir)]
    return [
        _Trainer(spec, workloads_of(spec), config.out_dir / spec) for spec in config.case_b_kinds
    ]


def _run_bench(config: BenchConfig, progress: Callable[[str], None] | None) -> dict[str, Any]:
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    from .device import DEVICE_FIELDS, describe

    device = describe(config.workloads.python) if config.probe_device else {}
    names = scenario_order(config.scenarios)
    measured = [n for n in names if n != "sequential"]
    alone = [n for n in measured if n in CASE_A_ONLY]
    own = [n for n in measured if n not in CASE_A_ONLY]
    trainers = _trainers(config)

    from tqdm import tqdm

    steps = 1 + int(config.check_load) + config.repeats * (len(alone) + len(trainers) * len(own))
    bar = tqdm(total=steps, desc="gpreempt bench", unit="step")
    try:
        bar.set_postfix_str("calibrating Case-A")
        harness = Harness(
            trainers[0].workloads,
            out / "arrivals.json",
            0.0,
            config.bg,
            config.gpreempt,
            config.mps_control,
            nvml=config.nvml,
        )
        service_ms = calibrate(harness, out / "calibration", config.calibrate_requests, config.load)
        service_s = statistics.fmean(service_ms) / 1000.0
        rate = arrival_rate(config.load, service_s)
        load_check = None
        if config.check_load:
            bar.update(1)
            bar.set_postfix_str("checking Case-A's load alone")
            rate, load_check = check_load(
                harness, out / "load_check", config.load, rate, config.requests, config.seed
            )
        offsets = poisson_arrivals(config.requests, rate, config.seed)
        (out / "arrivals.json").write_text(json.dumps(offsets))
        memory = _memory_plan(config, names, offsets[-1])
        facts = {
            "service_ms": service_ms,
            "service_s": service_s,
            "rate": rate,
            "load_check": load_check,
            "span_s": offsets[-1],
            "memory_plan": memory.as_dict() if memory else None,
            "device": {k: device.get(k) for k in DEVICE_FIELDS},
        }
        harnesses = {
            t.label: Harness(
                t.workloads,
                out / "arrivals.json",
                offsets[-1],
                config.bg,
                config.gpreempt,
                config.mps_control,
                nvml=config.nvml,
                memory=memory,
                serve_args=config.serve_args,
            )
            for t in trainers
        }
        bar.update(1)

        def run(trainer: _Trainer, name: str, repeat: int, raws: dict[str, RawScenario]) -> None:
            where = f"{trainer.label}: " if trainer.label else ""
            bar.set_postfix_str(f"{where}{name} (repeat {repeat + 1}/{config.repeats})")
            base = out if name in CASE_A_ONLY else trainer.out
            a_alone = raws.get("a-alone")
            b_alone_s = (
                a_alone.window[1] - a_alone.window[0]
                if a_alone is not None and a_alone.window
                else offsets[-1] + service_s
            )
            raws[name] = run_scenario(
                harnesses[trainer.label], name, base / "runs" / f"r{repeat}" / name, b_alone_s
            )
            if progress:
                progress(f"{where}{name}: {'valid' if raws[name].valid else 'INVALID'}")
            bar.update(1)

        runs: dict[str, list[dict[str, RawScenario]]] = {t.label: [] for t in trainers}
        for repeat in range(config.repeats):
            shared: dict[str, RawScenario] = {}
            for name in alone:
                if name != A_AFTER:
                    run(trainers[0], name, repeat, shared)
            per_trainer = {t.label: dict(shared) for t in trainers}
            for trainer in trainers:
                for name in own:
                    run(trainer, name, repeat, per_trainer[trainer.label])
            if A_AFTER in alone:
                run(trainers[0], A_AFTER, repeat, shared)
                for raws in per_trainer.values():
                    raws[A_AFTER] = shared[A_AFTER]
            for label, raws in per_trainer.items():
                runs[label].append({n: raws[n] for n in measured})
            # every repeat written as it ends, the plots only once all are: a run stopped
            # later, while it draws them included, keeps every repeat it finished
            results = [_write_results(config, t, runs[t.label], names, facts) for t in trainers]
    finally:
        bar.close()
    for t, result in zip(trainers, results, strict=True):
        result["plots"] = list(all_plots(runs[t.label][0], t.out))
        _save(t.out, result)
    return results[0]


def _write_results(
    config: BenchConfig,
    trainer: _Trainer,
    runs: list[dict[str, RawScenario]],
    names: Sequence[str],
    facts: dict[str, Any],
) -> dict[str, Any]:
    """One trainer's results.json and report.md, in its directory, without plots (drawn once
    every repeat is done); ``params.repeats`` says how many repeats are done."""
    per_repeat = [_rows(raws, names) for raws in runs]
    scenarios = {
        name: combine_memory_flags(
            combine_repeats([rows[name] for rows in per_repeat]),
            [rows[name] for rows in per_repeat],
        )
        for name in names
    }
    workloads = trainer.workloads
    params = {
        "load": config.load,
        "requests": config.requests,
        "bg": config.bg,
        "case_a": config.case_a,
        "case_a_batch": workloads.case_a_batch,
        "case_a_fn": workloads.case_a_fn,
        "case_b": workloads.case_b_fn or workloads.case_b_cmd or workloads.case_b_kind,
        # variables set for Case-A's processes only (--env-a), and for Case-B's (--env-b, and
        # a --case-b entry's own)
        "env_a": dict(workloads.env_a),
        "env_b": dict(workloads.env_b),
        # the trainers whose runs shared Case-A's runs alone (one: none shared)
        "case_b_together": list(config.case_b_kinds) if len(config.case_b_kinds) > 1 else [],
        "scenarios": list(names),
        "repeats": len(runs),
        "repeats_planned": config.repeats,
        "seed": config.seed,
        "quick": config.quick,
        "warmup_s": workloads.warmup_s,
        "service_ms_alone": facts["service_s"] * 1000.0,
        "service_ms_calibration": latency_summary(facts["service_ms"]),
        "arrival_rate_per_s": facts["rate"],
        "load_check": facts["load_check"],  # Case-A alone before the repeats (None: none)
        "arrivals_span_s": facts["span_s"],
        "command": config.command,
        "serve_args": list(config.serve_args),
        "memory_plan": facts["memory_plan"],
        # settings the workloads inherit (e.g. GPREEMPT_IDLE_GRACE_MS changes gpreempt's policy)
        "env": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith(("GPREEMPT_", "CUDA_", "PYTORCH_")) and k != "GPREEMPT_RUNTIME_DIR"
        },
    }
    results: dict[str, Any] = {
        "gpreempt_version": __version__,
        "generated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": facts["device"],
        "params": params,
        "scenarios": scenarios,
        "plots": [],
    }
    _save(trainer.out, results)
    return results


def _save(out: Path, results: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)  # a trainer's own directory, in a shared run
    (out / "results.json").write_text(json.dumps(results, indent=1, default=_jsonable))
    (out / "report.md").write_text(render(results))


def _memory_plan(config: BenchConfig, names: Sequence[str], span_s: float) -> MemoryPlan | None:
    """The memory scenarios' plan from GPU 0's free memory now (None when none is asked for)."""
    if not any(n in MEMORY_SCENARIOS for n in names):
        return None
    if config.memory_probe is not None:
        probe = config.memory_probe()
    else:
        probe = probe_gpu(config.workloads.python, config.workloads.environment())
    c = config
    return make_plan(
        probe, span_s, c.ballast_gib, c.growth_gib, c.reserve_gib, c.growth_at_s, c.memory_settle_s
    )


def _rows(raws: dict[str, RawScenario], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Metrics of one repeat, each co-located scenario against this repeat's references."""
    a_alone, b_alone = raws.get("a-alone"), raws.get("b-alone")
    b_ref = b_rate(b_alone) if b_alone is not None and b_alone.valid else None
    a_ref = a_alone if a_alone is not None and a_alone.valid else None
    rows = {name: scenario_metrics(raw, a_ref, b_ref) for name, raw in raws.items()}
    if "sequential" in names:
        rows["sequential"] = sequential_metrics(rows["a-alone"], rows["b-alone"])
    return {name: rows[name] for name in names}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
