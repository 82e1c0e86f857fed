"""Benchmark workloads, usable on their own or through ``python -m gpreempt.bench.workloads``.

The built-in Case-A (:func:`resnet50_server`) and Case-B (:func:`transformer_trainer`) live in
:mod:`.builtin_workloads` and can be imported from here too.

Your own jobs: ``--fn MODULE:FACTORY`` names a factory called with no arguments. For ``serve``
it returns a callable that handles one request and returns when the answer is ready; for
``train`` it returns a callable that runs one step and returns ``None`` or an object with
``synchronize()`` that completes with the step (e.g. a ``torch.cuda.Event`` recorded after it).

Command line (the harness builds these; see :mod:`gpreempt.bench.loops` for the handshake)::

    python -m gpreempt.bench.workloads serve --ready-file R --go-file G --arrivals A --out O
    python -m gpreempt.bench.workloads serve --calibrate 200 --out O
    python -m gpreempt.bench.workloads train --ready-file R --stop-file S --out O
    python -m gpreempt.bench.workloads combined ...   # both in one process (stream priority)
    python -m gpreempt.bench.workloads scheduled ...  # both in one process under GPUScheduler

Memory pressure: ``train --ballast-bytes N`` holds N bytes of device memory beside the model;
``serve --grow-bytes N --grow-at-s T`` grows Case-A's working set by N bytes inside the first
request due T seconds into the window (see :class:`gpreempt.bench.loops.Growth`); such a server
runs eagerly, without its CUDA graph. Device memory
is torch's (:class:`TorchMemory`) unless ``--memory-fn MODULE:FACTORY`` names an object with
``free_bytes()``, ``allocate(nbytes)`` (MemoryError when out of memory) and ``release(blocks)``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import loops
from .builtin_workloads import (
    CASE_B_KINDS,
    TorchMemory,
    cupy_trainer,
    jax_trainer,
    resnet50_server,
    transformer_trainer,
)

__all__ = ["main", "resnet50_server", "transformer_trainer", "TorchMemory"]


def _memory_from(args: argparse.Namespace) -> loops.DeviceMemory:
    if args.memory_fn:
        return loops.load_callable(args.memory_fn)()
    return TorchMemory(args.device)


def _server_from(args: argparse.Namespace) -> Callable[[], Any]:
    if args.fn:
        return loops.load_callable(args.fn)()
    # A server that may run out of memory serves eagerly: after an out-of-memory error in the
    # process, the next replay of a captured CUDA graph faulted with an illegal address
    # (PyTorch 2.11 on an H200), with or without emptying the cache.
    graph = not getattr(args, "grow_bytes", 0) and not getattr(args, "eager", False)
    return resnet50_server(batch=args.batch, device=args.device, graph=graph)


def _trainer_from(fn: str | None, args: argparse.Namespace) -> Callable[[], Any]:
    if fn:
        return loops.load_callable(fn)()
    kind = getattr(args, "kind", "transformer")
    if kind in ("cupy", "cupy-torch"):
        return cupy_trainer(with_torch=kind == "cupy-torch")
    if kind in ("jax", "jax-torch"):
        return jax_trainer(with_torch=kind == "jax-torch")
    return transformer_trainer(
        d_model=args.d_model,
        layers=args.layers,
        batch=args.train_batch,
        seq=args.seq,
        device=args.device,
        sync_loss=kind == "transformer-sync",
        compiled=kind == "transformer-compiled",
    )


def _stream(priority: int | None) -> contextlib.AbstractContextManager[Any]:
    """A fresh CUDA stream of ``priority`` (lower = more urgent) as a context, where torch and a
    GPU are in use; a no-op otherwise."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or priority is None:
        return contextlib.nullcontext()
    try:
        least, greatest = torch.cuda.Stream.priority_range()
    except AttributeError:  # older releases: 0 is normal, -1 high
        least, greatest = 0, -1
    clamped = max(greatest, min(least, priority))
    return torch.cuda.stream(torch.cuda.Stream(priority=clamped))


def _serve_main(handle: Callable[[], Any], args: argparse.Namespace, extra: dict[str, Any]) -> int:
    loops.warm_up(handle, args.warmup_requests, args.warmup_s)
    if args.calibrate:
        isolated = loops.calibrate(handle, args.calibrate)
        service = isolated
        if args.calibrate_load:
            service = loops.calibrate_under_load(handle, isolated, args.calibrate_load)
        data = {"pid": os.getpid(), "service_ms": service, "isolated_ms": isolated}
        loops.write_json(args.out, {**data, **extra})
        return 0
    offsets = json.loads(Path(args.arrivals).read_text())
    growth = None
    if getattr(args, "grow_bytes", 0):
        growth = loops.Growth(
            _memory_from(args),
            loops.growth_index(offsets, args.grow_at_s),
            args.grow_bytes,
            args.grow_chunk_bytes,
            args.grow_wait_s,
        )
    loops.mark_ready(args.ready_file)
    ready_t = time.time()
    go = json.loads(loops.wait_for_file(args.go_file, args.go_timeout_s))
    served = growth.wrap(handle) if growth else handle
    hint = contextlib.nullcontext if getattr(args, "no_request", False) else loops.request_context()
    gpu_ms = getattr(handle, loops.GPU_MS, None)
    if isinstance(gpu_ms, list):
        gpu_ms.clear()  # those of the warm-up and the calibration
    result = loops.serve(served, offsets, float(go["t0"]), hint)
    if isinstance(gpu_ms, list) and len(gpu_ms) == len(result["start"]):
        extra = {**extra, loops.GPU_MS: list(gpu_ms)}
    if growth:
        extra = {**extra, "growth": growth.release()}
    out = {"pid": os.getpid(), "ready_t": ready_t, **result, **extra, "gate": gate_stats()}
    loops.write_json(args.out, out)
    return 0


def serve_command(args: argparse.Namespace) -> int:
    return _serve_main(_server_from(args), args, {})


def train_command(args: argparse.Namespace) -> int:
    stop = loops.StopFlag(args.stop_file)
    step = _trainer_from(args.fn, args)
    ballast = []
    if args.ballast_bytes:  # held until the process exits
        ballast.append(_memory_from(args).allocate(args.ballast_bytes))
    warm = loops.warm_up(step, args.warmup_steps, args.warmup_s)
    loops.mark_ready(args.ready_file)
    ready_t = time.time()
    times = loops.train(step, stop, args.max_seconds)
    loops.write_json(
        args.out,
        {
            "pid": os.getpid(),
            "ready_t": ready_t,
            "warmup_steps": warm,
            "ballast_bytes": args.ballast_bytes,
            "step_end_t": times,
            "stopped_t": time.time(),
            "gate": gate_stats(),
        },
    )
    return 0


def gate_stats() -> dict[str, Any] | None:
    """The launch gate's counters, if this process runs under one (for diagnosis), with the
    driver-level gate's from the process's control block under ``driver``."""
    from ..client import session
    from ..client.gate import current_gate

    gate = current_gate()
    stats = None if gate is None else dict(gate.stats())
    own = session.current()
    if own is not None:
        block = own.control.stats()
        if block.driver_gate != "none":
            stats = stats or {}
            stats["driver"] = {k: v for k, v in vars(block).items() if k.startswith("driver")}
    return stats


def combined_command(args: argparse.Namespace) -> int:
    """Case-A and Case-B in one process: serving on a high-priority stream in the main thread,
    training on a low-priority stream in a second thread (what one process can do today)."""
    sys.setswitchinterval(args.switch_interval_s)
    handle = _server_from(args)
    stop = threading.Event()
    warmed = threading.Event()
    out: dict[str, Any] = {}
    failure: list[BaseException] = []

    def trainer() -> None:
        try:
            with _stream(0):
                step = _trainer_from(args.train_fn, args)
                out["warmup_steps"] = loops.warm_up(step, args.warmup_steps, args.warmup_s)
                warmed.set()
                out["step_end_t"] = loops.train(step, stop.is_set, args.max_seconds)
                out["stopped_t"] = time.time()
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
            warmed.set()

    thread = threading.Thread(target=trainer, name="case-b", daemon=True)
    thread.start()
    warmed.wait()
    if failure:
        raise failure[0]
    with _stream(-10):
        code = _serve_main(handle, args, {"train_thread": True})
    stop.set()
    thread.join()
    if failure:
        raise failure[0]
    loops.write_json(args.train_out, {"pid": os.getpid(), **out})
    return code


def scheduled_command(args: argparse.Namespace) -> int:
    """Case-A and Case-B in one process under ``gpreempt.GPUScheduler``: Case-B's training
    steps as a low task (active while it trains), Case-A's requests as a high task that is
    active only inside ``gpreempt.request()`` (``active_during_call=False``)."""
    import gpreempt

    sys.setswitchinterval(args.switch_interval_s)
    handle = _server_from(args)
    stop = threading.Event()
    warmed = threading.Event()
    out: dict[str, Any] = {}
    code = [1]

    def train_task() -> bool:
        try:
            step = _trainer_from(args.train_fn, args)
            out["warmup_steps"] = loops.warm_up(step, args.warmup_steps, args.warmup_s)
        finally:
            warmed.set()
        out["step_end_t"] = loops.train(step, stop.is_set, args.max_seconds)
        out["stopped_t"] = time.time()
        return False

    def serve_task() -> bool:
        try:
            warmed.wait()
            if "warmup_steps" in out:  # else Case-B failed: run() raises its error
                code[0] = _serve_main(handle, args, {"scheduler": True})
        finally:
            stop.set()
        return False

    sched = gpreempt.GPUScheduler()
    sched.register_task("case-b", train_task, priority="low")
    sched.register_task("case-a", serve_task, priority="high", active_during_call=False)
    try:
        stats = sched.run()
    finally:
        sched.close()
    loops.write_json(args.train_out, {"pid": os.getpid(), **out, "scheduler_stats": stats})
    return code[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpreempt.bench.workloads",
        description="Benchmark workloads: Case-A inference (serve), Case-B training (train).",
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    serve = sub.add_parser("serve", help="serve requests at scheduled arrival times")
    train = sub.add_parser("train", help="train until the stop file appears or SIGTERM")
    both = sub.add_parser("combined", help="serve and train in one process (two threads)")
    sched = sub.add_parser(
        "scheduled", help="serve and train in one process under gpreempt.GPUScheduler"
    )
    for p in (serve, train, both, sched):
        p.add_argument("--device", default="cuda", help="torch device (default cuda)")
        p.add_argument("--ready-file", help="written once warmed up")
        p.add_argument("--out", required=True, help="results JSON")
        p.add_argument("--warmup-s", type=float, default=2.0, help="warm up at least this long")
        p.add_argument("--max-seconds", type=float, default=1800.0, help="safety stop")
        p.add_argument(
            "--memory-fn",
            metavar="MODULE:FACTORY",
            help="device memory for --ballast-bytes/--grow-bytes (default: torch's)",
        )
    for p in (serve, both, sched):
        p.add_argument("--fn", help="MODULE:FACTORY returning a request handler (your own job)")
        p.add_argument("--batch", type=int, default=8, help="ResNet-50 batch (default 8)")
        p.add_argument("--go-file", help="JSON {t0}: serve arrivals from t0")
        p.add_argument("--go-timeout-s", type=float, default=600.0)
        p.add_argument("--arrivals", help="JSON list of arrival offsets in seconds")
        p.add_argument("--calibrate", type=int, default=0, help="measure N isolated requests")
        p.add_argument(
            "--calibrate-load",
            type=float,
            default=0.0,
            help="then N requests open loop at this load, twice: their service times count",
        )
        p.add_argument("--warmup-requests", type=int, default=50)
    serve.add_argument(
        "--eager", action="store_true", help="serve eagerly, without replaying a CUDA graph"
    )
    serve.add_argument(
        "--no-request",
        action="store_true",
        help="never call gpreempt.request(): gpreempt sees requests only by their GPU work",
    )
    serve.add_argument("--grow-bytes", type=int, default=0, help="grow the working set once")
    serve.add_argument("--grow-at-s", type=float, default=0.0, help="first request due then")
    serve.add_argument("--grow-chunk-bytes", type=int, default=512 << 20)
    serve.add_argument(
        "--grow-wait-s", type=float, default=0.0, help="wait for room this long when out of memory"
    )
    for p in (train, both, sched):
        p.add_argument("--d-model", type=int, default=1024)
        p.add_argument("--layers", type=int, default=8)
        p.add_argument("--train-batch", type=int, default=16)
        p.add_argument("--seq", type=int, default=512)
        p.add_argument("--warmup-steps", type=int, default=10)
    train.add_argument("--fn", help="MODULE:FACTORY returning a training step (your own job)")
    train.add_argument(
        "--kind", choices=CASE_B_KINDS, default="transformer", help="built-in training step"
    )
    train.add_argument("--stop-file", help="stop when this file appears")
    train.add_argument(
        "--ballast-bytes", type=int, default=0, help="hold this much device memory beside the model"
    )
    for p in (both, sched):
        p.add_argument("--train-fn", help="MODULE:FACTORY returning a training step")
        p.add_argument("--train-out", required=True, help="training results JSON")
        p.add_argument(
            "--switch-interval-s",
            type=float,
            default=0.0005,
            help="Python thread switch interval, so the serving thread is not held 5 ms by the GIL",
        )
    serve.set_defaults(func=serve_command)
    train.set_defaults(func=train_command)
    both.set_defaults(func=combined_command)
    sched.set_defaults(func=scheduled_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
