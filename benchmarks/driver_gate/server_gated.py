"""What gpreempt costs the graph server by itself, with nothing else on the GPU, part by part.

Each round starts a fresh server process per mode (ResNet-50 fp16 b8 replayed from a CUDA
graph, as Case-A "light", cuDNN's heuristics), warms it up, and times ``--requests`` requests
each after 1 ms idle, as many back to back, and as many queued ahead (each behind a 0.5 ms
kernel, so that the GPU never waits for the host). A request's GPU span is timed by events
before its input's copy and after its output's, so where the GPU waits for the host to submit
the request (the launch path: the driver, a tools library's callbacks, the operator hook) that
time counts in it, as in the request's latency; queued ahead, the span is the GPU's alone.
Modes, in turn within each round (the order reversed every other round):

* ``plain``: no gpreempt (the bench's ``a-alone``);
* ``injected``: the driver-level gate's library loaded through ``CUDA_INJECTION64_PATH``,
  with no daemon to talk to;
* ``gated``: under ``gpreempt run --priority high`` with a private daemon, requests unmarked
  (the bench's ``a-alone-gated-no-request``); ``gated-request``: each request in
  ``gpreempt.request()`` (``a-alone-gated``);
* ``gated-kept``, ``gated-no-driver``, ``gated-no-operator``, ``gated-neither``: ``gated``
  with the driver-level gate keeping CUPTI while it sleeps (``GPREEMPT_DRIVER_DETACH=0``),
  without it (``GPREEMPT_DRIVER_GATE=0``), without the operator gate (``GPREEMPT_GATE=0``),
  without both;
* ``probe-none``, ``probe-subscribe``, ``probe-resource``, ``probe-graph``, ``probe-driver``:
  ``cupti_probe.cpp`` (built here with g++) through ``CUDA_INJECTION64_PATH``, doing one part of
  what the driver-level gate does with CUPTI (its header says which), no daemon;
  ``probe-unsubscribe``, ``probe-finalize``, ``probe-resubscribe``: subscribed, then once warm
  let go (``cuptiUnsubscribe``), detached (and ``cuptiFinalize``), or subscribed again.

Each process also times the host's part of each CUDA call of a request after 1 ms idle
(``calls_us``): which call a mode slows.

    PYTHONPATH=src python3 benchmarks/driver_gate/server_gated.py --rounds 3 --out FILE
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpreempt.bench.device import rounds_parser, usable_modes

MODES = (
    "plain",
    "injected",
    "gated",
    "gated-request",
    "gated-kept",
    "gated-no-driver",
    "gated-no-operator",
    "gated-neither",
    "probe-none",
    "probe-subscribe",
    "probe-resource",
    "probe-graph",
    "probe-driver",
    "probe-unsubscribe",
    "probe-finalize",
    "probe-resubscribe",
)
KINDS = ("idle", "b2b", "ahead")
_DETACHING = ("unsubscribe", "finalize", "resubscribe")
_ENV = {
    "gated-kept": {"GPREEMPT_DRIVER_DETACH": "0"},
    "gated-no-driver": {"GPREEMPT_DRIVER_GATE": "0"},
    "gated-no-operator": {"GPREEMPT_GATE": "0"},
    "gated-neither": {"GPREEMPT_DRIVER_GATE": "0", "GPREEMPT_GATE": "0"},
}


def _child(requests: int, mark: bool) -> None:
    import contextlib

    from gpreempt.bench.builtin_workloads import resnet50_server

    scope: Any = contextlib.nullcontext
    if mark:
        import gpreempt

        scope = gpreempt.request
    request = resnet50_server()
    spans = request.gpu_ms  # type: ignore[attr-defined]
    for _ in range(30):
        request()
    import torch

    out: dict[str, Any] = {}
    if os.environ.get("GPREEMPT_PROBE") in _DETACHING:
        import ctypes

        probe = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
        out["detach_rc"] = probe.gpreempt_probe_detach()
    out["calls_us"] = _host_calls(request, requests)
    for kind in KINDS:
        del spans[:]
        walls = []
        for _ in range(requests):
            if kind == "idle":
                time.sleep(1e-3)
            elif kind == "ahead":  # the GPU busy 0.5 ms first: the request is queued ahead
                torch.cuda._sleep(1_000_000)
            t = time.perf_counter()
            with scope():
                request()
            walls.append((time.perf_counter() - t) * 1e3)
        out[kind] = {
            "span_p50_ms": statistics.median(spans),
            "wall_p50_ms": statistics.median(walls),
        }
    if os.environ.get("GPREEMPT_PROBE") is None and os.environ.get("CUDA_INJECTION64_PATH"):
        import ctypes  # the driver-level gate's mode at the end (3: CUPTI let go)

        gate = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
        out["driver_mode"] = gate.gpreempt_driver_mode()
    print(json.dumps(out), flush=True)


def _host_calls(request: Any, requests: int) -> dict[str, float]:
    """The host's time in each CUDA call of a request (us, median; each request after 1 ms
    idle), timed by wrapping the PyTorch methods that the request calls."""
    import torch

    times: dict[str, list[float]] = {}
    wrapped = [
        (torch.cuda.Event, "record"),
        (torch.Tensor, "copy_"),
        (torch.cuda.CUDAGraph, "replay"),
        (torch.cuda.Stream, "synchronize"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name in wrapped]
    order: list[str] = []

    def timed(name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return method(*args, **kwargs)
            finally:
                order.append(name)
                times.setdefault(f"{len(order)}-{name}", []).append(
                    (time.perf_counter_ns() - t) / 1e3
                )

        return call

    try:
        for owner, name, method in saved:
            setattr(owner, name, timed(name, method))
        for _ in range(requests):
            time.sleep(1e-3)
            del order[:]
            request()
    finally:
        for owner, name, method in saved:
            setattr(owner, name, method)
    return {k: statistics.median(v) for k, v in times.items()}


def _argv(mode: str, rd: Path, requests: int) -> list[str]:
    me = [sys.executable, __file__, "--child", str(requests)]
    if mode == "gated-request":
        me.append("--mark")
    if not mode.startswith("gated"):
        return me
    name = f"server-{mode}"
    return [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", str(rd), "--priority",
            "high", "--name", name, "--", *me]  # fmt: skip


def _env(mode: str, empty: Path) -> dict[str, str]:
    env = {**os.environ, **_ENV.get(mode, {})}
    if mode == "injected":
        from gpreempt.client.gate.driver_build import build

        path = str(build())
        env.update(CUDA_INJECTION64_PATH=path, GPREEMPT_RUNTIME_DIR=str(empty))
    elif mode.startswith("probe-"):
        env.update(CUDA_INJECTION64_PATH=str(_probe()), GPREEMPT_PROBE=mode[len("probe-") :])
    return env


def _probe() -> Path:
    """cupti_probe.cpp built beside the driver-level gate's library, with its flags."""
    from gpreempt.client.gate import driver_build as b

    source = Path(__file__).with_name("cupti_probe.cpp")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"gpreempt_cupti_probe_{digest}.so"
    if not out.exists():
        cupti = b.find_library_dir("cupti")
        includes = [f"-I{d}" for d in b.find_include_dirs()]
        subprocess.run(
            ["g++", "-O2", "-shared", "-fPIC", *includes, str(source), "-o", str(out),
             f"-L{cupti}", b._link_flag(cupti, "cupti"), f"-Wl,-rpath,{cupti}"],
            check=True,
        )  # fmt: skip
    return out


def _run(mode: str, rd: Path, empty: Path, requests: int) -> dict[str, Any]:
    proc = subprocess.run(
        _argv(mode, rd, requests), env=_env(mode, empty), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"{mode}: exit {proc.returncode}: {' '.join(tail)}")
    return json.loads(lines[-1])


def summarise(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per mode and kind of request: the processes' medians, and their median over processes."""
    out: dict[str, Any] = {}
    for mode, runs in rows.items():
        if not runs:
            continue
        out[mode] = {}
        for kind in KINDS:
            for what in ("span_p50_ms", "wall_p50_ms"):
                values = [r[kind][what] for r in runs]
                out[mode][f"{kind}_{what}"] = {"runs": values, "median": statistics.median(values)}
        calls = [r["calls_us"] for r in runs if "calls_us" in r]
        if calls:
            out[mode]["calls_us"] = {
                k: statistics.median(c[k] for c in calls if k in c) for k in calls[0]
            }
        for key in ("detach_rc", "driver_mode"):
            if any(key in r for r in runs):
                out[mode][key] = [r.get(key) for r in runs]
    return out


def main(argv: list[str] | None = None) -> int:
    args_ = sys.argv[1:] if argv is None else argv
    if args_[:1] == ["--child"]:
        _child(int(args_[1]), "--mark" in args_)
        return 0
    args = rounds_parser(__doc__.split("\n\n")[0], MODES, rounds=3).parse_args(args_)
    modes = usable_modes("server_gated", args.modes, MODES)
    if modes is None:
        return 2
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="gps-") as tmp:
        rd, empty = Path(tmp) / "rd", Path(tmp) / "none"
        empty.mkdir()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(rd)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(3)
            for round_ in range(args.rounds):
                for mode in modes if round_ % 2 == 0 else modes[::-1]:
                    try:
                        rows[mode].append(_run(mode, rd, empty, args.requests))
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        print(f"server_gated: {exc}", file=sys.stderr)
                        return 1
                    r = rows[mode][-1]
                    spans = " ".join(f"{k} {r[k]['span_p50_ms']:.3f}" for k in KINDS)
                    print(f"{round_} {mode:18s} {spans} ms", flush=True)
                    if args.out:
                        args.out.write_text(json.dumps(summarise(rows), indent=1) + "\n")
        finally:
            daemon.terminate()
            daemon.wait()
    print("mode               GPU span p50 (ms) after 1 ms idle / back to back / queued ahead")
    for mode, s in summarise(rows).items():
        print(f"{mode:18s} " + " / ".join(f"{s[f'{k}_span_p50_ms']['median']:.3f}" for k in KINDS))
    print("mode               host time per call after 1 ms idle (us, median of processes)")
    for mode, s in summarise(rows).items():
        calls = s.get("calls_us", {})
        print(f"{mode:18s} " + " ".join(f"{k} {v:.1f}" for k, v in calls.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
