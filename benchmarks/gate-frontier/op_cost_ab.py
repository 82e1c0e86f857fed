"""Per-operator costs in the gate, A/B in one process: throughput and the work left queued.

    python3 benchmarks/gate-frontier/op_cost_ab.py --out OUT.json [--rounds 3] [--seconds 3]

Case-B's Transformer trainer runs for ``--seconds`` under each setting, the settings
alternating for ``--rounds`` rounds:

* ``ungated``: no gate;
* ``open/costs`` and ``open/average``: the gate with its open window (no one more important
  around), each operator at its own timed cost, or all at the average cost (the gate's overhead);
* ``tight/costs`` and ``tight/average``: the window pinned tight at ``--window-ms``.

After each step (its optimizer update was the last thing launched) the script times how long
the GPU still needs to finish what is queued: about what a high-priority kernel arriving then
would wait for. Prints steps/s relative to ungated and the queued time's P50/P99.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2] / "src"))

SETTINGS: dict[str, dict[str, Any] | None] = {
    "ungated": None,
    "open/costs": {"mode": "open", "op_costs": True},
    "open/average": {"mode": "open", "op_costs": False},
    "tight/costs": {"mode": "tight", "op_costs": True},
    "tight/average": {"mode": "tight", "op_costs": False},
}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_setting(step: Any, gate_kwargs: dict[str, Any] | None, seconds: float, window_ms: float):
    import torch

    from gpreempt.client.gate import install_gate
    from gpreempt.control import ControlBlock

    control = ControlBlock.create() if gate_kwargs is not None else None
    gate = None
    if control is not None:
        gate = install_gate(
            control, bound=True, auto_activity=False, window_ms=window_ms, **gate_kwargs
        )
    try:
        for _ in range(3):  # the first steps under a fresh gate teach it the costs
            step()
        torch.cuda.synchronize()
        queued_ms: list[float] = []
        steps = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            step()
            steps += 1
            if steps % 4 == 0:
                mark = time.perf_counter()
                torch.cuda.synchronize()
                queued_ms.append((time.perf_counter() - mark) * 1e3)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        stats = gate.stats() if gate is not None else {}
    finally:
        if gate is not None:
            gate.uninstall()
        if control is not None:
            control.close()
    costs = sorted(stats.get("op_costs", []), key=lambda row: -row[2])[:12]
    return {
        "steps_per_s": steps / elapsed,
        "queued_ms": queued_ms,
        "samples_taken": stats.get("samples_taken"),
        "samples_dropped": stats.get("samples_dropped"),
        "us_per_launch": stats.get("us_per_launch"),
        "bound_waits": stats.get("bound_waits"),
        "costliest_ops": [list(row) for row in costs],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--seconds", type=float, default=3.0, help="per setting and round")
    parser.add_argument("--window-ms", type=float, default=0.25, help="the tight window")
    args = parser.parse_args()

    import torch

    from gpreempt.bench.workloads import transformer_trainer

    step = transformer_trainer()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for round_no in range(args.rounds):
        for name, kwargs in SETTINGS.items():
            runs[name].append(run_setting(step, kwargs, args.seconds, args.window_ms))
            print(
                f"round {round_no} {name}: {runs[name][-1]['steps_per_s']:.2f} steps/s", flush=True
            )
    base = sum(r["steps_per_s"] for r in runs["ungated"]) / args.rounds
    summary = {}
    for name, rows in runs.items():
        queued = [q for r in rows for q in r["queued_ms"]]
        summary[name] = {
            "steps_per_s": sum(r["steps_per_s"] for r in rows) / len(rows),
            "ratio": sum(r["steps_per_s"] for r in rows) / len(rows) / base,
            "ratio_per_round": [
                r["steps_per_s"] / u["steps_per_s"]
                for r, u in zip(rows, runs["ungated"], strict=True)
            ],
            "queued_p50_ms": _percentile(queued, 0.5),
            "queued_p99_ms": _percentile(queued, 0.99),
        }
    result = {
        "params": vars(args),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "summary": summary,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'setting':14} {'steps/s':>8} {'ratio':>6} {'rounds':>20} {'queued p50, p99 ms':>18}")
    for name, row in summary.items():
        rounds = " ".join(f"{r:.3f}" for r in row["ratio_per_round"])
        print(
            f"{name:14} {row['steps_per_s']:8.2f} {row['ratio']:6.3f} {rounds:>20} "
            f"{row['queued_p50_ms']:10.2f} {row['queued_p99_ms']:7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
