"""How long a request that finds a trainer's kernel running waits for it: the trainer's kernels
as the GPU ran them, from a PyTorch profile of its steps alone.

A gate holds a trainer between kernels (its barriers sit between launches), so a request that
arrives while one of the trainer's kernels runs waits at least for what is left of that
kernel, however dense the barriers. At a moment taken at random while the trainer's kernels
run, the kernel in flight is one of duration d with probability proportional to d, and half
of it is left on average: the expected wait is sum(d^2) / (2 sum(d)). This prints that figure
for each built-in PyTorch trainer, with the kernels' count per step and their durations, and
the share of the GPU time spent in kernels longer than the barriers' spacing (0.2 ms): those
no barrier can cut.

    PYTHONPATH=src python3 benchmarks/driver_gate/kernel_residual.py --out residual.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KINDS = ("transformer-sync", "transformer-compiled")
#: The barriers' spacing in GPU time (ms): kernels longer than it hold a request past it.
SPACING_MS = 0.2


def kernel_durations_us(trace: dict[str, Any]) -> list[float]:
    """The durations (us) of the GPU kernels in a Chrome trace that ``torch.profiler``
    exported (``"cat": "kernel"`` events); copies and memsets are not kernels."""
    return [
        float(e["dur"])
        for e in trace.get("traceEvents", [])
        if isinstance(e, dict) and e.get("cat") == "kernel" and "dur" in e
    ]


def residual(durations_us: Sequence[float], steps: int, spacing_ms: float = SPACING_MS) -> dict:
    """What a request meets of these kernels (run over ``steps`` steps): their count per
    step, the GPU time per step (ms), their durations' median, 99th percentile and longest
    (us), the share of the GPU time in kernels longer than ``spacing_ms``, and the expected
    rest of the kernel in flight at a random moment of the trainer's GPU time (us)."""
    if not durations_us or steps <= 0:
        raise ValueError("no kernels: was the profile taken on a GPU?")
    ordered = sorted(durations_us)
    total = sum(ordered)
    long = sum(d for d in ordered if d > spacing_ms * 1e3)

    def q(f: float) -> float:
        return ordered[min(len(ordered) - 1, int(f * len(ordered)))]

    return {
        "kernels_per_step": len(ordered) / steps,
        "gpu_ms_per_step": total / steps / 1e3,
        "kernel_us_p50": q(0.5),
        "kernel_us_p99": q(0.99),
        "kernel_us_max": ordered[-1],
        "share_in_kernels_over_spacing": long / total,
        "expected_rest_us": sum(d * d for d in ordered) / (2 * total),
    }


def profile(kind: str, steps: int, warmup: int) -> dict[str, Any]:  # pragma: no cover (GPU)
    """Run ``warmup`` steps of a built-in trainer (compiling it, for the compiled one), then
    profile ``steps`` more; the Chrome trace of the GPU's activity."""
    import torch

    from gpreempt.bench.builtin_workloads import transformer_trainer

    step = transformer_trainer(sync_loss=True, compiled=kind == "transformer-compiled")
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--steps", type=int, default=20, help="steps profiled (default 20)")
    parser.add_argument("--warmup", type=int, default=10, help="steps before (default 10)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    if args.steps <= 0 or args.warmup < 0:
        parser.error("--steps must be positive and --warmup not negative")
    results = {}
    for kind in args.kinds:
        try:
            results[kind] = residual(kernel_durations_us(profile(kind, args.steps, args.warmup)),
                                     args.steps)  # fmt: skip
        except (ImportError, RuntimeError, AssertionError, ValueError) as exc:
            print(f"kernel_residual: {kind}: {exc}", file=sys.stderr)
            return 1
        r = results[kind]
        print(f"{kind}: {r['kernels_per_step']:.0f} kernels a step, {r['gpu_ms_per_step']:.1f} "
              f"ms of GPU a step; kernel median {r['kernel_us_p50']:.0f} us, p99 "
              f"{r['kernel_us_p99']:.0f}, longest {r['kernel_us_max']:.0f}; "
              f"{100 * r['share_in_kernels_over_spacing']:.0f} % of the GPU time in kernels "
              f"over {SPACING_MS:g} ms; a request's expected wait for the kernel in flight "
              f"{r['expected_rest_us']:.0f} us")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
