"""How much the graph server's speed moves from one start of its process to the next.

Each round starts a fresh server process per mode (ResNet-50 fp16 b8 replayed from a CUDA
graph, as Case-A "light"), warms it up, and times 300 requests, each after 1 ms idle, alone
on the GPU; the median GPU span of each process is one sample. Modes:

* ``benchmark``: cuDNN times its algorithms at the first requests (as the bench's server did);
* ``heuristics``: cuDNN picks them without timing (the bench's server now);
* ``benchmark-busy``: as ``benchmark``, while another process keeps the GPU busy during the
  server's warm-up only (stopped before the timed requests), as a trainer would beside a
  server that starts;
* ``heuristics-ballast``: as ``heuristics``, while another process holds ``--ballast-gib`` of
  the GPU's memory, allocated and written before the server starts and idle throughout, as a
  held trainer's memory is: whether where the server's memory lands moves its speed (beside a
  held trainer the bench's server ran a few % faster or slower than alone, by run).

    PYTHONPATH=src python3 benchmarks/driver_gate/server_spread.py --rounds 6 --out FILE
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import time
from typing import Any

from gpreempt.bench.device import rounds_parser, usable_modes

MODES = ("benchmark", "heuristics", "benchmark-busy", "heuristics-ballast")


def _busy(stop: Any) -> None:  # another context: 1 ms kernels back to back until told to stop
    import torch

    torch.cuda.init()
    while not stop.is_set():
        for _ in range(20):
            torch.cuda._sleep(2_000_000)
        torch.cuda.synchronize()


def _ballast(gib: float, ready: Any, stop: Any) -> None:  # another context holding memory, idle
    import torch

    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    ready.set()
    stop.wait()
    del held


def _server(mode: str, requests: int, ballast_gib: float, out: Any) -> None:
    import torch

    from gpreempt.bench.builtin_workloads import resnet50_server

    spawn = mp.get_context("spawn")
    stop = spawn.Event()
    busy = None
    if mode == "benchmark-busy":
        busy = spawn.Process(target=_busy, args=(stop,), daemon=True)
        busy.start()
        time.sleep(8.0)  # its CUDA is up (PyTorch's import included) and its kernels run
    elif mode == "heuristics-ballast":
        ready = spawn.Event()
        busy = spawn.Process(target=_ballast, args=(ballast_gib, ready, stop), daemon=True)
        busy.start()
        if not ready.wait(120):
            raise RuntimeError("the ballast process did not get its memory")
    request = resnet50_server(cudnn_benchmark=mode.startswith("benchmark"))
    for _ in range(20):
        request()
    if mode == "benchmark-busy":
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
    if busy is not None and busy.is_alive():
        stop.set()
        busy.join()
    out.send(statistics.median(spans))


def summarise(rows: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per mode: each process's median GPU span (ms), and their median, least and most."""
    return {
        m: {"spans_p50_ms": v, "min": min(v), "max": max(v), "median": statistics.median(v)}
        for m, v in rows.items()
        if v
    }


def main(argv: list[str] | None = None) -> int:
    parser = rounds_parser(__doc__.split("\n\n")[0], MODES, rounds=6)
    parser.add_argument("--ballast-gib", type=float, default=16.0, help="heuristics-ballast's hold")
    args = parser.parse_args(argv)
    modes = usable_modes("server_spread", args.modes, MODES)
    if modes is None:
        return 2
    ctx = mp.get_context("spawn")
    rows: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            mine, theirs = ctx.Pipe()
            args_ = (mode, args.requests, args.ballast_gib, theirs)
            proc = ctx.Process(target=_server, args=args_)
            proc.start()
            theirs.close()  # so that a server process that dies ends the wait below
            try:
                rows[mode].append(mine.recv())
            except EOFError:
                proc.join()
                print(
                    f"server_spread: the {mode} process died (exit {proc.exitcode})",
                    file=sys.stderr,
                )
                return 1
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
