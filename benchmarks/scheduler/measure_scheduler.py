"""Case-A and Case-B as threads of one process: plain stream priority against GPUScheduler.

    python benchmarks/scheduler/measure_scheduler.py --out OUT.json [--requests 1000]

Case-A: ResNet-50 fp16 batch 8 replayed from a CUDA graph, open-loop Poisson arrivals at load
0.5 of its median service time alone. Case-B: the 8-layer Transformer training step. All
scenarios run in this one process on the same arrivals:
  a-alone           Case-A alone (the P99 reference)
  b-alone           Case-B alone (the throughput reference)
  stream-priority   Case-B in a thread on a normal stream, Case-A on the highest-priority
                    stream (what one process can do without gpreempt)
  gpreempt-scheduler  gpreempt.GPUScheduler: case-a high (request() per request), case-b low
Prints a table last; writes every number to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import torch

import gpreempt
from gpreempt.bench import loops
from gpreempt.bench.load import poisson_arrivals
from gpreempt.bench.stats import latency_summary
from gpreempt.bench.workloads import resnet50_server, transformer_trainer


def serve_all(handle, offsets, hint) -> dict:
    return loops.serve(handle, offsets, time.time() + 0.05, hint=hint)


def latencies(record) -> list[float]:
    return [(e - s) * 1e3 for s, e in zip(record["scheduled"], record["end"], strict=True)]


def run_trainer(step, stop: threading.Event, times: list[float]) -> None:
    times.extend(loops.train(step, stop.is_set, 600))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--load", type=float, default=0.5)
    args = parser.parse_args()
    sys.setswitchinterval(0.0005)
    _low, high = torch.cuda.Stream.priority_range()
    a_stream = torch.cuda.Stream(priority=high)
    with torch.cuda.stream(a_stream):
        handle = resnet50_server(8)
    step = transformer_trainer()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with torch.cuda.stream(a_stream):
        service = sorted(loops.calibrate(handle, 200))[100]
    offsets = poisson_arrivals(args.requests, args.load / (service / 1e3), seed=1)
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "params": {"requests": args.requests, "load": args.load, "service_ms_alone": service},
        "scenarios": {},
    }

    with torch.cuda.stream(a_stream):
        alone = serve_all(handle, offsets, None)
    window = alone["end"][-1] - alone["scheduled"][0]
    results["scenarios"]["a-alone"] = {"a_latency_ms": latency_summary(latencies(alone))}

    stop, times = threading.Event(), []
    trainer = threading.Thread(target=run_trainer, args=(step, stop, times))
    start = time.time()
    trainer.start()
    time.sleep(min(window, 10))
    stop.set()
    trainer.join()
    b_rate = sum(1 for t in times if t > start + 1) / (times[-1] - start - 1)
    results["scenarios"]["b-alone"] = {"b_steps_per_s": b_rate}

    def co_located(name: str, use_scheduler: bool) -> None:
        stop, times = threading.Event(), []
        record: dict = {}
        if use_scheduler:
            sched = gpreempt.GPUScheduler()

            def train_loop() -> bool:
                run_trainer(step, stop, times)
                return False

            def serve_loop() -> bool:
                time.sleep(1.0)  # Case-B warm in its thread first
                record.update(serve_all(handle, offsets, gpreempt.request))
                stop.set()
                return False

            sched.register_task("case-b", train_loop, priority="low")
            sched.register_task("case-a", serve_loop, priority="high", active_during_call=False)
            try:
                stats = sched.run()
            finally:
                sched.close()
        else:
            trainer = threading.Thread(target=run_trainer, args=(step, stop, times))
            trainer.start()
            time.sleep(1.0)
            with torch.cuda.stream(a_stream):
                record.update(serve_all(handle, offsets, None))
            stop.set()
            trainer.join()
            stats = None
        begin, end = record["scheduled"][0], record["end"][-1]
        inside = sum(1 for t in times if begin <= t <= end) / (end - begin)
        lat = latency_summary(latencies(record))
        results["scenarios"][name] = {
            "a_latency_ms": lat,
            "a_p99_ratio": lat["p99"] / results["scenarios"]["a-alone"]["a_latency_ms"]["p99"],
            "b_steps_per_s": inside,
            "b_kept": inside / b_rate,
            "scheduler_stats": stats,
        }

    co_located("stream-priority", False)
    co_located("gpreempt-scheduler", True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"service alone {service:.3f} ms, B alone {b_rate:.1f} steps/s")
    print(f"{'scenario':<20} {'P50 ms':>8} {'P99 ms':>8} {'P99 ratio':>10} {'B kept':>7}")
    nan = float("nan")
    for name, row in results["scenarios"].items():
        lat = row.get("a_latency_ms") or {}
        p50, p99 = lat.get("p50", nan), lat.get("p99", nan)
        ratio, kept = row.get("a_p99_ratio", nan), row.get("b_kept", nan)
        print(f"{name:<20} {p50:>8.3f} {p99:>8.3f} {ratio:>10.2f} {kept:>7.2f}")


if __name__ == "__main__":
    main()
