"""How much the graph server's speed moves from one start of its process to the next.

Each round starts a fresh server process per mode (ResNet-50 fp16 b8 replayed from a CUDA
graph, as Case-A "light"), warms it up, and times 300 requests, each after 1 ms idle, alone
on the GPU; the median GPU span of each process is one sample. Modes:

* ``benchmark``: cuDNN times its algorithms at the first requests (as the bench's server did);
* ``heuristics``: cuDNN picks them without timing (the bench's server now);
* ``benchmark-busy``: as ``benchmark``, while another process keeps the GPU busy during the
  server's warm-up only (stopped before the timed requests), as a trainer would beside a
  server that starts.

    PYTHONPATH=src python3 benchmarks/driver_gate/server_spread.py --rounds 6 --out FILE
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("benchmark", "heuristics", "benchmark-busy")


def _busy(stop: Any) -> None:  # another context: 1 ms kernels back to back until told to stop
    import torch

    torch.cuda.init()
    while not stop.is_set():
        for _ in range(20):
            torch.cuda._sleep(2_000_000)
        torch.cuda.synchronize()


def _server(mode: str, requests: int, out: Any) -> None:
    import torch

    from gpreempt.bench.builtin_workloads import resnet50_server

    stop = mp.get_context("spawn").Event()
    busy = None
    if mode == "benchmark-busy":
        busy = mp.get_context("spawn").Process(target=_busy, args=(stop,), daemon=True)
        busy.start()
        time.sleep(8.0)  # its CUDA is up (PyTorch's import included) and its kernels run
    request = resnet50_server(cudnn_benchmark=mode != "heuristics")
    for _ in range(20):
        request()
    if busy is not None:
        stop.set()
        busy.join()
    spans = request.gpu_ms  # type: ignore[attr-defined]
    del spans[:]
    for _ in range(50):
        request()
    del spans[:]
    for _ in range(requests):
        time.sleep(1e-3)
        request()
    torch.cuda.synchronize()
    out.send(statistics.median(spans))


def summarise(rows: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per mode: each process's median GPU span (ms), and their median, least and most."""
    return {
        m: {"spans_p50_ms": v, "min": min(v), "max": max(v), "median": statistics.median(v)}
        for m, v in rows.items()
        if v
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("server_spread: PyTorch is not installed here", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("server_spread: no CUDA GPU here", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    rows: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_server, args=(mode, args.requests, theirs))
            proc.start()
            rows[mode].append(mine.recv())
            proc.join()
            print(f"{mode:15s} {rows[mode][-1]:.3f} ms", flush=True)
            if args.out:  # after every process: a run cut short keeps what it measured
                args.out.write_text(json.dumps(summarise(rows), indent=1) + "\n")
    for mode, s in summarise(rows).items():
        low, high = s["min"], s["max"]
        print(f"{mode:15s} median {s['median']:.3f} ms over processes, {low:.3f}-{high:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
