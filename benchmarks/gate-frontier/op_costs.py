"""Where a training step's GPU time goes, operator by operator, and how uneven it is.

    python3 benchmarks/gate-frontier/op_costs.py --out OUT.json [--steps 5]

The gate bounds a low-priority task's in-flight work by counting operators at their average
GPU cost. That bound is only as good as the average: a few long operators (an optimizer's
``_foreach_`` updates over every parameter, a large GEMM) can each hold the GPU many times
longer than the average one. This script profiles Case-B's training step (the bench's
Transformer trainer) with ``torch.profiler`` and reports, per top-level ATen operator, how often
it runs per step and how much GPU time its kernels take per call, and the longest kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "src"))


def profile(steps: int, warmup: int, device: str) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from gpreempt.bench.workloads import transformer_trainer

    step = transformer_trainer(device=device)
    on_gpu = device.startswith("cuda")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    for _ in range(warmup):
        step()
    sync()
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    events = prof.events()
    per_op: dict[str, dict[str, float]] = defaultdict(
        lambda: {"calls": 0, "gpu_us": 0.0, "max_us": 0.0}
    )
    kernels: list[tuple[float, str]] = []
    ops = all_ops = 0
    for ev in events:
        if ev.device_type != torch.autograd.DeviceType.CPU or not ev.name.startswith("aten::"):
            continue
        kernels.extend((k.duration, k.name) for k in ev.kernels)
        all_ops += 1  # the gate counts every ATen operator, nested ones too
        parent = ev.cpu_parent
        if parent is not None and str(parent.name).startswith("aten::"):
            continue  # only top-level ATen operators: their kernels include their children's
        ops += 1
        gpu = ev.device_time_total
        row = per_op[ev.name]
        row["calls"] += 1
        row["gpu_us"] += gpu
        row["max_us"] = max(row["max_us"], gpu)
    total = sum(r["gpu_us"] for r in per_op.values())
    rows = [
        {
            "op": name,
            "calls_per_step": r["calls"] / steps,
            "gpu_us_per_step": r["gpu_us"] / steps,
            "mean_us": r["gpu_us"] / r["calls"],
            "max_us": r["max_us"],
            "share": r["gpu_us"] / total if total else 0.0,
        }
        for name, r in per_op.items()
    ]
    rows.sort(key=lambda r: -r["gpu_us_per_step"])
    kernels.sort(reverse=True)
    return {
        "steps": steps,
        "top_level_ops_per_step": ops / steps,
        "aten_ops_per_step": all_ops / steps,
        "gpu_us_per_step": total / steps,
        "mean_us_per_op": total / ops if ops else 0.0,
        "mean_us_per_counted_op": total / all_ops if all_ops else 0.0,
        "ops": rows,
        "longest_kernels": [{"us": us, "name": name[:120]} for us, name in kernels[:20]],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if on_gpu else device,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--steps", type=int, default=5, help="profiled training steps")
    parser.add_argument("--warmup", type=int, default=5, help="unprofiled steps first")
    parser.add_argument("--device", default="cuda", help="torch device (cpu: a smoke test)")
    args = parser.parse_args()
    result = profile(args.steps, args.warmup, args.device)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        f"{result['top_level_ops_per_step']:.0f} top-level ops/step "
        f"({result['aten_ops_per_step']:.0f} counting nested ones, mean "
        f"{result['mean_us_per_counted_op']:.1f} us), "
        f"{result['gpu_us_per_step'] / 1000:.2f} ms GPU/step, "
        f"mean {result['mean_us_per_op']:.1f} us/op"
    )
    print(f"{'op':38} {'calls':>6} {'us/step':>9} {'mean us':>8} {'max us':>8} {'share':>6}")
    for r in result["ops"][:18]:
        print(
            f"{r['op'][:38]:38} {r['calls_per_step']:6.0f} {r['gpu_us_per_step']:9.0f} "
            f"{r['mean_us']:8.1f} {r['max_us']:8.1f} {r['share']:6.1%}"
        )
    print(
        "longest kernels (us):", ", ".join(f"{k['us']:.0f}" for k in result["longest_kernels"][:8])
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
