"""A whole benchmark run: calibrate Case-A, fix the arrivals, run every scenario (and repeat),
then write results.json, report.md and the plots into the run's directory."""

from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import UsageError
from .load import arrival_rate, poisson_arrivals
from .memory_pressure import MemoryPlan, make_plan, probe_gpu
from .plots import all_plots
from .report import render
from .scenario_catalog import (
    A_AFTER,
    ALL_SCENARIOS,
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
    workloads: Workloads = field(default_factory=Workloads)
    gpreempt: tuple[str, ...] = (sys.executable, "-m", "gpreempt")
    mps_control: str = "nvidia-cuda-mps-control"
    nvml: bool = True
    serve_args: tuple[str, ...] = ()  # extra options for the scenarios' private daemon
    probe_device: bool = True
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
        make_plan({}, 1.0, self.ballast_gib, self.growth_gib, self.reserve_gib, self.growth_at_s)


def scenario_order(names: Sequence[str]) -> list[str]:
    """The references first (always measured: every ratio needs them), then the rest in the
    canonical order; ``sequential`` is derived, not run."""
    wanted = set(names) | set(REFERENCES)
    if wanted - {*REFERENCES, "sequential", A_AFTER}:
        wanted.add(A_AFTER)  # something shares the GPU: how far Case-A alone drifted meanwhile
    return [n for n in ALL_SCENARIOS if n in wanted]


def run_bench(config: BenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run everything and write the outputs; returns the results.json content.

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


def _run_bench(config: BenchConfig, progress: Callable[[str], None] | None) -> dict[str, Any]:
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    from .device import describe

    device = describe(config.workloads.python) if config.probe_device else {}
    names = scenario_order(config.scenarios)
    measured = [n for n in names if n != "sequential"]

    from tqdm import tqdm

    bar = tqdm(total=1 + len(measured) * config.repeats, desc="gpreempt bench", unit="step")
    try:
        bar.set_postfix_str("calibrating Case-A")
        harness = Harness(
            config.workloads,
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
        offsets = poisson_arrivals(config.requests, rate, config.seed)
        (out / "arrivals.json").write_text(json.dumps(offsets))
        harness = Harness(
            config.workloads,
            out / "arrivals.json",
            offsets[-1],
            config.bg,
            config.gpreempt,
            config.mps_control,
            nvml=config.nvml,
            memory=_memory_plan(config, names, offsets[-1]),
            serve_args=config.serve_args,
        )
        bar.update(1)
        runs: list[dict[str, RawScenario]] = []
        for repeat in range(config.repeats):
            raws: dict[str, RawScenario] = {}
            for name in measured:
                bar.set_postfix_str(f"{name} (repeat {repeat + 1}/{config.repeats})")
                a_alone = raws.get("a-alone")
                b_alone_s = (
                    a_alone.window[1] - a_alone.window[0]
                    if a_alone is not None and a_alone.window
                    else offsets[-1] + service_s
                )
                raws[name] = run_scenario(
                    harness, name, out / "runs" / f"r{repeat}" / name, b_alone_s
                )
                if progress:
                    progress(f"{name}: {'valid' if raws[name].valid else 'INVALID'}")
                bar.update(1)
            runs.append(raws)
    finally:
        bar.close()

    per_repeat = [_rows(raws, names) for raws in runs]
    scenarios = {
        name: combine_memory_flags(
            combine_repeats([rows[name] for rows in per_repeat]),
            [rows[name] for rows in per_repeat],
        )
        for name in names
    }
    calib = latency_summary(service_ms)
    params = {
        "load": config.load,
        "requests": config.requests,
        "bg": config.bg,
        "case_a": config.case_a,
        "case_a_batch": config.workloads.case_a_batch,
        "case_a_fn": config.workloads.case_a_fn,
        "case_b": config.workloads.case_b_fn
        or config.workloads.case_b_cmd
        or config.workloads.case_b_kind,
        "scenarios": names,
        "repeats": config.repeats,
        "seed": config.seed,
        "quick": config.quick,
        "warmup_s": config.workloads.warmup_s,
        "service_ms_alone": service_s * 1000.0,
        "service_ms_calibration": calib,
        "arrival_rate_per_s": rate,
        "arrivals_span_s": offsets[-1],
        "command": config.command,
        "serve_args": list(config.serve_args),
        "memory_plan": harness.memory.as_dict() if harness.memory else None,
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
        "device": {k: device.get(k) for k in ("name", "driver", "cuda", "torch")},
        "params": params,
        "scenarios": scenarios,
    }
    results["plots"] = list(all_plots(runs[0], out))
    (out / "results.json").write_text(json.dumps(results, indent=1, default=_jsonable))
    (out / "report.md").write_text(render(results))
    return results


def _memory_plan(config: BenchConfig, names: Sequence[str], span_s: float) -> MemoryPlan | None:
    """The memory scenarios' plan from GPU 0's free memory now (None when none is asked for)."""
    if not any(n in MEMORY_SCENARIOS for n in names):
        return None
    if config.memory_probe is not None:
        probe = config.memory_probe()
    else:
        probe = probe_gpu(config.workloads.python, config.workloads.environment())
    return make_plan(
        probe,
        span_s,
        config.ballast_gib,
        config.growth_gib,
        config.reserve_gib,
        config.growth_at_s,
        config.memory_settle_s,
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
