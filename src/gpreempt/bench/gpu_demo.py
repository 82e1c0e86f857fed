"""The short GPU demonstration behind ``gpreempt demo``: Case-A ResNet-50 batch 8 (high
priority, Poisson at load 0.5) beside Case-B Transformer training (low priority), alone, under
default time slicing, and under gpreempt (mechanism auto). About two minutes on one GPU."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

DEMO_SCENARIOS = ("a-alone", "time-sliced", "gpreempt")


def run_gpu_demo(quick: bool = True, out_dir: Path | None = None) -> dict[str, Any]:
    """Run the demo. Returns ``{"rows": [...], "out_dir": str, "service_ms_alone": float}``,
    one row per scenario: {scenario, a_p50_ms, a_p99_ms, b_steps_per_s, a_p99_ratio, b_kept,
    valid, invalid_reason}.

    ``quick`` uses 400 requests and 1 s warm-ups (else 1000 and 2 s). Outputs (results.json,
    report.md, plots) go to ``out_dir``, by default a new temporary directory.
    """
    from .runner import BenchConfig, run_bench
    from .workload_argv import Workloads

    directory = out_dir or Path(tempfile.mkdtemp(prefix="gpreempt-demo-"))
    config = BenchConfig(
        out_dir=directory,
        load=0.5,
        requests=400 if quick else 1000,
        bg=1,
        case_a="light",
        scenarios=DEMO_SCENARIOS,
        quick=quick,
        calibrate_requests=100,
        workloads=Workloads(warmup_s=1.0 if quick else 2.0, warmup_steps=5),
        nvml=False,
        command="gpreempt demo",
    )
    results = run_bench(config)
    rows = []
    for name in ("a-alone", "b-alone", *DEMO_SCENARIOS[1:]):  # b-alone: every run has it
        row = results["scenarios"].get(name)
        if row is None:
            continue
        latency = row.get("a_latency_ms") or {}
        rows.append(
            {
                "scenario": name,
                "a_p50_ms": latency.get("p50"),
                "a_p99_ms": latency.get("p99"),
                "b_steps_per_s": row.get("b_steps_per_s"),
                "a_p99_ratio": row.get("a_p99_ratio"),
                "b_kept": row.get("b_kept"),
                "valid": row.get("valid"),
                "invalid_reason": row.get("invalid_reason"),
            }
        )
    return {
        "rows": rows,
        "out_dir": str(directory),
        "service_ms_alone": results["params"]["service_ms_alone"],
    }
