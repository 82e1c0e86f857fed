"""Measure the launch gate on one GPU: overhead, drain latency, identical training.

Usage: python benchmarks/gate/measure_gate.py --out DIR [--layers 8] [--rounds 3]

Writes DIR/gate_measure.json (every raw number) and prints a short summary. All ratios are
taken side by side in this one process, in interleaved rounds, so clock drift and other
tenants touch every configuration alike.

1. Overhead: an eager Transformer encoder training loop (d=1024, 16 heads, batch 16x512,
   bf16 autocast, AdamW) in steps/s with no gate, and with the gate installed and open under
   several settings (open window as a lone trainer sees it; tight windows forced on; automatic
   activity only). Each configuration's steps are timed one by one: besides the ratio of
   speeds per round, the ratio of the median step times with a 95 % interval, which a
   CPU-bound loop on a shared host needs (step_time_ratio).
2. Drain latency: while the loop trains, another thread closes the gate at random moments and
   times how long until the device has no work left (cudaDeviceSynchronize returns), then
   opens it again 2 ms later. Compared with an unbounded gate (what PyTorch queues ahead).
3. Activity detection cost: a small fp16 inference request every 3 ms, each one an
   idle->active->idle transition, latency with and without auto_activity.
4. Bit-identical weights: a small Transformer trained with a fixed seed, gate off twice (the
   determinism control) and gate on with a thread closing and opening it, compared bitwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

from gpreempt.client.gate import RUN_BARRIER_MS, install_gate, resolve_config  # noqa: E402
from gpreempt.client.gate.build import load_native  # noqa: E402
from gpreempt.control_block import ControlBlock  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Trainer:
    """The Case-B workload of docs/bench.md (8-layer Transformer encoder training)."""

    def __init__(
        self, layers: int, d: int = 1024, batch: int = 16, seq: int = 512, sync: bool = False
    ) -> None:
        self.sync = sync  # read the loss every step, as loops that log it do
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(
            d, 16, 4 * d, dropout=0.0, batch_first=True, device="cuda"
        )
        self.model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, seq, d, device="cuda")

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = self.model(self.x)
        loss = out.float().pow(2).mean()
        loss.backward()
        self.opt.step()
        if self.sync:
            loss.item()

    def step_times(self, steps: int, warmup: int = 3) -> list[float]:
        """Wall time of each of ``steps`` steps (s); the last one includes the wait for the GPU
        to finish what they queued, so the sum is the time the steps took."""
        for _ in range(warmup):
            self.step()
        torch.cuda.synchronize()
        times = []
        last = time.perf_counter()
        for i in range(steps):
            self.step()
            if i == steps - 1:
                torch.cuda.synchronize()
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return times

    def rate(self, steps: int, warmup: int = 3) -> float:
        return steps / sum(self.step_times(steps, warmup))


_TIGHT = {"bound": True, "auto_activity": False, "mode": "tight"}

OVERHEAD_CONFIGS: dict[str, dict | None] = {
    "none": None,
    "auto_only": {"bound": False, "auto_activity": True},
    "bound_default_open": {"bound": True, "auto_activity": False},
    "bound_auto_default_open": {"bound": True, "auto_activity": True},
    "tight_K32_W4_1ms": dict(_TIGHT),
    "tight_K32_W4_count_only": {**_TIGHT, "window_ms": 0.0},
    "tight_K64_W8_2ms": {**_TIGHT, "record_every": 64, "window_launches": 512, "window_ms": 2.0},
    "tight_time_only_3ms": {**_TIGHT, "window_launches": 1_000_000, "window_ms": 3.0},
    # stream barriers as `gpreempt run --mechanism gate` puts them by default: with no more
    # important task registered (no share from the daemon: none are put), and with one
    # registered but idle (`share_ms`: as the daemon's in-flight share says so)
    "barriers_alone": {"bound": True, "auto_activity": True, "barrier_ms": RUN_BARRIER_MS},
    "barriers_idle_server": {
        "bound": True,
        "auto_activity": True,
        "barrier_ms": RUN_BARRIER_MS,
        "share_ms": 1.0,
    },
    # what `gpreempt run --priority low` gets with a more important task registered: barriers
    # from its operator hook while that task was active lately (as barriers_idle_server), and
    # once it has been idle longer (the daemon's sleep_ok) the gate asleep, its operator hook
    # off and its sleep thread putting the barriers
    "defaults_idle_server": {
        "bound": True,
        "auto_activity": True,
        "barrier_ms": RUN_BARRIER_MS,
        "share_ms": 1.0,
        "sleep_ok": True,
    },
    # the same asleep, without barriers: what the sleep thread's barriers cost
    "asleep_no_barriers": {
        "bound": True,
        "auto_activity": True,
        "share_ms": 1.0,
        "sleep_ok": True,
    },
}

#: The configurations of ``--phases overhead-defaults``: what the defaults cost a trainer.
DEFAULTS_CONFIGS = (
    "none",
    "barriers_alone",
    "barriers_idle_server",
    "defaults_idle_server",
    "asleep_no_barriers",
)

HEAVY_CONFIGS = (
    "none",
    "auto_only",
    "bound_default_open",
    "tight_K32_W4_1ms",
    "barriers_alone",
    "barriers_idle_server",
)


def step_time_ratio(
    steps: dict[str, list[list[float]]], name: str, draws: int = 1000, seed: int = 0
) -> tuple[float, list[float]]:
    """The ungated median step time over ``name``'s, and a 95 % interval of it.

    Medians of every step of every round: a step the host stalled for (which on a shared
    machine moves a round's mean by tens of percent) does not move them. The interval resamples
    whole rounds, keeping each round's steps of both configurations together. Meant for a
    trainer that cannot run ahead of its GPU (CPU-bound, or reading its loss every step): one
    that can queues its first steps in no time and waits for them all in the last.
    """

    def ratio(rounds: list[int]) -> float:
        base = [t for r in rounds for t in steps["none"][r]]
        ours = [t for r in rounds for t in steps[name][r]]
        return statistics.median(base) / statistics.median(ours)

    indices = list(range(len(steps["none"])))
    rng = random.Random(seed)
    ratios = sorted(ratio(rng.choices(indices, k=len(indices))) for _ in range(draws))
    return ratio(indices), [ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]]


def measure_overhead(
    trainer: Trainer,
    control: ControlBlock,
    rounds: int,
    steps: int,
    names: tuple[str, ...],
    warmup: int = 2,
) -> dict:
    """Interleaved rounds; each configuration's speed against the same rounds' ungated speed.

    Every round runs each configuration once for ``steps`` steps, in an order shuffled per
    round (fixed seed), so neither drift nor a configuration's place in the round favours one.
    Two figures: the median over rounds of the ratio of the round's rates, and the ratio of
    the median step times (robust to the stalls of a shared host, see step_time_ratio).
    """
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    gate_stats: dict[str, dict] = {}
    order = list(names)
    rng = random.Random(1)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            kwargs = dict(OVERHEAD_CONFIGS[name] or {})
            control.set_window_share(kwargs.pop("share_ms", None))
            control.set_sleep_ok(kwargs.pop("sleep_ok", False))
            gate = (
                install_gate(control, resolve_config(**kwargs)) if OVERHEAD_CONFIGS[name] else None
            )
            if gate is not None and control.sleep_ok:
                deadline = time.monotonic() + 1.0
                while not gate.stats().get("asleep") and time.monotonic() < deadline:
                    time.sleep(0.001)
            try:
                times[name].append(trainer.step_times(steps, warmup))
                if gate is not None:
                    stats = gate.stats()
                    stats.pop("config", None)
                    gate_stats[name] = stats
            finally:
                if gate is not None:
                    gate.uninstall()
                control.set_window_share(None)
                control.set_sleep_ok(False)
    rates = {name: [len(t) / sum(t) for t in blocks] for name, blocks in times.items()}
    paired = {
        name: [r / b for r, b in zip(rates[name], rates["none"], strict=True)] for name in names
    }
    by_step = {name: step_time_ratio(times, name) for name in names}
    return {
        "steps_per_round": steps,
        "step_seconds": times,
        "steps_per_s": rates,
        "median_steps_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "paired_ratios": paired,
        "ratio_to_none": {k: statistics.median(v) for k, v in paired.items()},
        "ratio_quartiles": {k: [percentile(v, 25), percentile(v, 75)] for k, v in paired.items()},
        "step_time_ratio": {k: v[0] for k, v in by_step.items()},
        "step_time_ratio_ci95": {k: v[1] for k, v in by_step.items()},
        "gate_stats_last_round": gate_stats,
        "configs": {name: OVERHEAD_CONFIGS[name] for name in names},
    }


def measure_drain(trainer: Trainer, control: ControlBlock, closures: int) -> dict:
    configs = {
        "unbounded": {"bound": False, "auto_activity": False},
        "adaptive_default": {"bound": True, "auto_activity": False},
        "open_window": {"bound": True, "auto_activity": False, "mode": "open"},
        "tight_time_only_1ms": {**_TIGHT, "window_launches": 1_000_000, "window_ms": 1.0},
    }
    out: dict[str, dict] = {}
    for name, kwargs in configs.items():
        gate = install_gate(control, resolve_config(**kwargs))
        stop = threading.Event()
        drains: list[float] = []
        notice: list[float] = []
        rng = random.Random(1)

        def controller(gate=gate, drains=drains, stop=stop, rng=rng) -> None:
            torch.cuda.set_device(0)
            time.sleep(0.3)  # let the loop run ahead
            for _ in range(closures):
                time.sleep(rng.uniform(0.02, 0.06))
                start = time.perf_counter()
                control.set_gate(True)
                torch.cuda.synchronize()
                drains.append((time.perf_counter() - start) * 1e3)
                time.sleep(0.002)
                control.set_gate(False)
            stop.set()

        thread = threading.Thread(target=controller)
        steps = 0
        thread.start()
        start = time.perf_counter()
        while not stop.is_set():
            trainer.step()
            steps += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        thread.join()
        stats = gate.stats()
        stats.pop("config", None)
        gate.uninstall()
        out[name] = {
            "drain_ms": drains,
            "p50_ms": percentile(drains, 50),
            "p99_ms": percentile(drains, 99),
            "max_ms": max(drains),
            "steps_per_s_while_toggled": steps / elapsed,
            "gate_stats": stats,
            "kwargs": kwargs,
        }
        del notice
    return out


def measure_activity(control: ControlBlock, blocks: int, per_block: int) -> dict:
    """A request (about 0.5 ms of GPU work) every 3 ms: each one wakes the activity detection."""
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU()) for _ in range(8)]
    model = torch.nn.Sequential(*layers).to("cuda", torch.float16)
    x = torch.randn(1024, 4096, device="cuda", dtype=torch.float16)
    results: dict[str, list[float]] = {"none": [], "auto": []}
    activations = 0
    with torch.inference_mode():
        for _ in range(20):
            model(x)
        torch.cuda.synchronize()
        for _block in range(blocks):
            for name in ("none", "auto"):
                gate = (
                    install_gate(control, resolve_config(bound=False, auto_activity=True))
                    if name == "auto"
                    else None
                )
                for _ in range(per_block):
                    time.sleep(0.003)
                    start = time.perf_counter()
                    model(x)
                    torch.cuda.synchronize()
                    results[name].append((time.perf_counter() - start) * 1e6)
                if gate is not None:
                    activations += gate.stats()["activations"]
                    gate.uninstall()
    summary = {
        name: {
            "mean_us": statistics.fmean(v),
            "p50_us": percentile(v, 50),
            "p99_us": percentile(v, 99),
        }
        for name, v in results.items()
    }
    return {
        "latency_us": results,
        "summary": summary,
        "mean_ratio_auto_to_none": summary["auto"]["mean_us"] / summary["none"]["mean_us"],
        "p50_ratio_auto_to_none": summary["auto"]["p50_us"] / summary["none"]["p50_us"],
        "p99_ratio_auto_to_none": summary["auto"]["p99_us"] / summary["none"]["p99_us"],
        "activations": activations,
        "requests_with_auto": blocks * per_block,
    }


def train_small(seed: int, steps: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.1, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 128, 256, device="cuda", generator=gen)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def measure_identical(control: ControlBlock, steps: int) -> dict:
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.use_deterministic_algorithms(True, warn_only=True)

    def compare(a: dict, b: dict) -> dict:
        same = all(torch.equal(a[k], b[k]) for k in a)
        diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
        return {"bit_identical": same, "max_abs_diff": diff}

    reference = train_small(7, steps)
    control_run = train_small(7, steps)
    results = {"ungated_vs_ungated": compare(reference, control_run)}
    for name, kwargs in {
        "tight_tiny_window_toggled": {
            "bound": True,
            "auto_activity": True,
            "mode": "tight",
            "record_every": 4,
            "window_launches": 4,
            "window_ms": 0.05,
        },
        "default_toggled": {"bound": True, "auto_activity": False},
    }.items():
        gate = install_gate(control, resolve_config(**kwargs))
        stop = threading.Event()

        def toggler(stop=stop) -> None:
            while not stop.is_set():
                control.set_gate(True)
                time.sleep(0.001)
                control.set_gate(False)
                time.sleep(0.002)

        thread = threading.Thread(target=toggler)
        thread.start()
        try:
            gated = train_small(7, steps)
        finally:
            stop.set()
            thread.join()
            control.set_gate(False)
        stats = gate.stats()
        gate.uninstall()
        results[name] = compare(reference, gated)
        results[name]["waits"] = stats["waits"]
        results[name]["bound_waits"] = stats["bound_waits"]
    torch.use_deterministic_algorithms(False)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--closures", type=int, default=60)
    parser.add_argument("--heavy-batch", type=int, default=48)
    parser.add_argument("--heavy-rounds", type=int, default=5)
    parser.add_argument("--heavy-steps", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--per-block", type=int, default=50)
    parser.add_argument(
        "--phases",
        help="comma-separated phases to run (default all): overhead, drain, overhead_heavy, "
        "drain_heavy, activity, identical, overhead_defaults, overhead_defaults_sync, "
        "overhead_defaults_heavy",
    )
    parser.add_argument(
        "--defaults-configs",
        default=",".join(DEFAULTS_CONFIGS),
        help="comma-separated configurations of the overhead_defaults phases (none comes first)",
    )
    parser.add_argument(
        "--cpus",
        help="CPUs to run on, e.g. 4-7 or 4,5 (os.sched_setaffinity; threads started later "
        "inherit it): keeps the scheduler from moving the trainer between cores",
    )
    args = parser.parse_args()
    defaults = tuple(dict.fromkeys(["none", *args.defaults_configs.split(",")]))
    unknown_configs = set(defaults) - set(OVERHEAD_CONFIGS)
    if unknown_configs:
        parser.error(f"unknown configuration(s): {', '.join(sorted(unknown_configs))}")
    if args.cpus:
        cpus: set[int] = set()
        try:
            for part in args.cpus.split(","):
                first, _, last = part.partition("-")
                cpus.update(range(int(first), int(last or first) + 1))
            os.sched_setaffinity(0, cpus)
        except (ValueError, OSError) as exc:
            parser.error(f"--cpus {args.cpus}: {exc} (give CPUs this machine has, e.g. 4-7)")
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    build_start = time.perf_counter()
    load_native()
    build_s = time.perf_counter() - build_start
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    result: dict = {
        "device": props.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "layers": args.layers,
        "native_build_or_load_s": build_s,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    control = ControlBlock.create()
    out_file = args.out / "gate_measure.json"

    def save() -> None:
        out_file.write_text(json.dumps(result, indent=1))

    trainer = Trainer(args.layers)
    trainer.rate(5)
    heavy: list[Trainer] = []
    syncing: list[Trainer] = []

    def sync_trainer() -> Trainer:
        if not syncing:
            syncing.append(Trainer(args.layers, sync=True))
            syncing[0].rate(3)
        return syncing[0]

    def heavy_trainer() -> Trainer:
        if not heavy:
            heavy.append(Trainer(args.layers, batch=args.heavy_batch))
            heavy[0].rate(3)
        return heavy[0]

    all_names = tuple(OVERHEAD_CONFIGS)
    phases = [
        (
            "overhead",
            lambda: measure_overhead(trainer, control, args.rounds, args.steps, all_names),
        ),
        ("drain", lambda: measure_drain(trainer, control, args.closures)),
        (
            "overhead_heavy",
            lambda: measure_overhead(
                heavy_trainer(), control, args.heavy_rounds, args.heavy_steps, HEAVY_CONFIGS
            ),
        ),
        ("drain_heavy", lambda: measure_drain(heavy_trainer(), control, args.closures)),
        ("activity", lambda: measure_activity(control, args.blocks, args.per_block)),
        ("identical", lambda: measure_identical(control, 30)),
        (
            "overhead_defaults",
            lambda: measure_overhead(trainer, control, args.rounds, args.steps, defaults),
        ),
        (
            "overhead_defaults_sync",
            lambda: measure_overhead(sync_trainer(), control, args.rounds, args.steps, defaults),
        ),
        (
            "overhead_defaults_heavy",
            lambda: measure_overhead(
                heavy_trainer(), control, args.heavy_rounds, args.heavy_steps, defaults
            ),
        ),
    ]
    if args.phases:
        wanted = {p.strip() for p in args.phases.split(",")}
        unknown = wanted - {name for name, _run in phases}
        if unknown:
            parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
        phases = [(name, run) for name, run in phases if name in wanted]
    for name, run in phases:
        t0 = time.perf_counter()
        try:
            result[name] = run()
        except Exception as exc:  # keep what the other phases measured
            import traceback

            result[name] = {"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()}
        result.setdefault("phase_seconds", {})[name] = time.perf_counter() - t0
        save()
        print(f"[{name}] {time.perf_counter() - t0:.1f}s", flush=True)
    result["total_seconds"] = time.perf_counter() - started
    save()

    print(f"device {result['device']} torch {result['torch']} build/load {build_s:.1f}s")
    for phase in (
        "overhead",
        "overhead_heavy",
        "overhead_defaults",
        "overhead_defaults_sync",
        "overhead_defaults_heavy",
    ):
        overhead = result.get(phase, {})
        if "error" in overhead:
            print(f"  {phase}: {overhead['error']}")
        for name, ratio in overhead.get("ratio_to_none", {}).items():
            med = overhead["median_steps_per_s"][name]
            q1, q3 = overhead["ratio_quartiles"][name]
            by_step = overhead.get("step_time_ratio", {}).get(name, float("nan"))
            lo, hi = overhead.get("step_time_ratio_ci95", {}).get(name, [float("nan")] * 2)
            gate = overhead.get("gate_stats_last_round", {}).get(name, {})
            asleep = (
                f"  asleep barriers {gate['asleep_barriers']} backlog wakes {gate['backlog_wakes']}"
                f" longest span {gate['asleep_longest_span_ms']:.2f} ms"
                if gate.get("sleeps")
                else ""
            )
            print(
                f"  {phase} {name:26s} {med:6.2f} steps/s ratio {ratio:.3f} "
                f"[{q1:.3f}-{q3:.3f}], of median step times {by_step:.3f} "
                f"(95% CI {lo:.3f}-{hi:.3f}){asleep}"
            )
    drains = {f"{p}/{k}": v for p in ("drain", "drain_heavy") for k, v in result.get(p, {}).items()}
    for name, d in drains.items():
        if isinstance(d, dict) and "p50_ms" in d:
            print(
                f"  drain {name:22s} p50 {d['p50_ms']:.2f} ms p99 {d['p99_ms']:.2f} ms "
                f"max {d['max_ms']:.2f} ms  steps/s {d['steps_per_s_while_toggled']:.2f}"
            )
        else:
            print(f"  drain {name}: {d}")
    act = result.get("activity", {})
    if "summary" in act:
        print(
            f"  activity mean ratio {act['mean_ratio_auto_to_none']:.4f} "
            f"p50 ratio {act['p50_ratio_auto_to_none']:.4f} "
            f"p99 ratio {act['p99_ratio_auto_to_none']:.4f} activations {act['activations']} "
            f"of {act['requests_with_auto']}"
        )
    else:
        print(f"  activity: {act}")
    print(f"  identical: {json.dumps(result.get('identical'))[:600]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
