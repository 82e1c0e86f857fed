"""How long a high-priority process's first kernel waits behind gated trainers.

    python3 benchmarks/gate-frontier/first_kernel.py --out OUT.json [--trainers 0,1,3]
        [--prep-ms 0,1] [--budgets 1.0] [--serve-args "--no-watch"] [--mps]

For each number of trainers (Case-B Transformer training, `gpreempt run --priority low
--mechanism gate`), a high-priority prober (`gpreempt run --priority high`) times, many times
after a random idle pause, how long one tiny kernel takes from launch to completion:

* ``no-hint``: the prober launches without warning; the gate's automatic activity detection
  tells the daemon at the first launch, and the kernel waits for the trainers' in-flight work
  (the preemption latency without a hint);
* ``hint-P``: the prober enters ``gpreempt.request()``, spends P ms preparing on the CPU, then
  launches (the hint closes the trainers' gates while it prepares).

``--budgets`` repeats everything for each in-flight budget of the daemon
(``serve --inflight-budget-ms``), restarting the daemon and the trainers for each;
``--serve-args`` passes more options to that daemon. ``--mps`` makes every process a client
of a private MPS daemon, the trainers at ``CUDA_MPS_CLIENT_PRIORITY=1`` (below normal).

The wait is the round trip minus the median round trip with no trainer. The round trip ends
with a host-side synchronisation whose wake-up jitter is part of every sample, so the prober
also stamps, with a one-instruction kernel queued right behind the tiny one, when the GPU got
to it (``%globaltimer``), put on the host's clock (a kernel feeds the GPU's clock to pinned
memory while the host reads it, before the trials). From the host's clock just before the
launch that gives the *start*; from the host's clock once both launch calls returned, the time
the work sat *queued* on the GPU, without the host's own jitter in launching. Each wait is the
value minus its median with no trainer. Writes every sample and a summary to OUT.json and
prints a table (the summary also has each value's own P50 and P99).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "src"))

from gpreempt.bench.mps import MpsDaemon  # noqa: E402
from gpreempt.policy.inflight import DEFAULT_BUDGET_MS  # noqa: E402


def _env(runtime: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["GPREEMPT_RUNTIME_DIR"] = str(runtime)
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _gp(runtime: Path, command: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpreempt", command, "--runtime-dir", str(runtime), *args]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# ------------------------------------------------------------------------- child processes
def train(args: argparse.Namespace) -> None:
    """A Case-B trainer: steps until killed; touches --ready after warming up."""
    from gpreempt.bench.workloads import transformer_trainer

    step = transformer_trainer()
    for _ in range(10):
        step().synchronize()
    Path(args.ready).touch()
    while True:
        step()


#: The samples timed on the GPU's clock, besides the round trips.
_STAMPED = ("starts_ms", "queued_ms")

#: ``stamp`` writes the GPU's nanosecond clock to its one argument; ``feed`` keeps writing it to
#: (host) memory for ``span`` ns of that clock, for the host to read it as it goes.
_STAMP_PTX = b"""
.version 7.8
.target sm_75
.address_size 64
.visible .entry stamp(.param .u64 out)
{
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u64 %rd3, %globaltimer;
    st.global.u64 [%rd2], %rd3;
    ret;
}
.visible .entry feed(.param .u64 out, .param .u64 span)
{
    .reg .b64 %rd<6>;
    .reg .pred %p;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [span];
    mov.u64 %rd3, %globaltimer;
    add.u64 %rd4, %rd3, %rd2;
LOOP:
    mov.u64 %rd5, %globaltimer;
    st.volatile.u64 [%rd1], %rd5;
    setp.lt.u64 %p, %rd5, %rd4;
    @%p bra LOOP;
    ret;
}
"""


class GpuStamp:
    """Launches the stamp kernel on torch's current stream, one 8-byte slot per call, and
    relates the GPU's clock to the host's (:meth:`host_minus_gpu_ns`)."""

    def __init__(self, torch, slots: int) -> None:
        import ctypes

        from cuda.bindings import driver as cu

        self._torch, self._cu, self._ctypes = torch, cu, ctypes
        self.out = torch.zeros(slots, dtype=torch.int64, device="cuda")
        err, self._module = cu.cuModuleLoadData(_STAMP_PTX)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuModuleLoadData: {err}")
        self._stamp = self._function(b"stamp")
        self._feed = self._function(b"feed")
        self._stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
        self(0)  # a first stamp, to fall back to round trips only where this does not work
        torch.cuda.synchronize()
        if int(self.out[0]) == 0:
            raise RuntimeError("the stamp kernel wrote nothing")

    def _function(self, name: bytes):
        err, function = self._cu.cuModuleGetFunction(self._module, name)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuModuleGetFunction({name!r}): {err}")
        return function

    def _launch(self, function, args: tuple) -> None:
        (err,) = self._cu.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, self._stream, args, 0)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel: {err}")

    def __call__(self, slot: int) -> None:
        address = self.out.data_ptr() + 8 * slot
        self._launch(self._stamp, ((address,), (self._ctypes.c_void_p,)))

    def host_minus_gpu_ns(self, span_ms: float = 5.0) -> int:
        """The host's clock (``time.time_ns``) minus the GPU's, to about a microsecond: the
        smallest gap between reading the GPU's clock from pinned memory, as ``feed`` writes
        it, and the host's clock right after. Launched raw, the kernel is no operator the
        gate sees; time-sliced or late, it only yields fewer useful samples."""
        ctypes = self._ctypes
        feed = self._torch.zeros(1, dtype=self._torch.int64, pin_memory=True)
        word = ctypes.c_int64.from_address(feed.data_ptr())
        args = ((feed.data_ptr(), int(span_ms * 1e6)), (ctypes.c_void_p, ctypes.c_uint64))
        self._launch(self._feed, args)
        best, last, deadline = None, 0, time.monotonic() + 5.0
        while time.monotonic() < deadline:
            gpu = word.value
            host = time.time_ns()
            if gpu != last:
                last = gpu
                best = host - gpu if best is None else min(best, host - gpu)
            elif best is not None and self._stream_done():
                break
        self._torch.cuda.synchronize()
        if best is None:
            raise RuntimeError("the feed kernel wrote nothing to host memory")
        return best

    def _stream_done(self) -> bool:
        return self._cu.cuStreamQuery(self._stream)[0] == self._cu.CUresult.CUDA_SUCCESS


def probe(args: argparse.Namespace) -> None:
    """The prober: tiny-kernel round trips and GPU start times, in one mode, after random
    pauses."""
    import torch

    import gpreempt

    x = torch.zeros(1, device="cuda")
    for _ in range(20):
        x.add_(1)
    torch.cuda.synchronize()
    try:
        stamp: GpuStamp | None = GpuStamp(torch, args.trials)
        offset = stamp.host_minus_gpu_ns()
    except (ImportError, RuntimeError, TypeError) as exc:
        print(f"no GPU stamps, round trips only: {exc}", file=sys.stderr)
        stamp, offset = None, 0
    launched: list[int] = []
    submitted: list[int] = []
    samples: list[float] = []

    def trial(slot: int) -> None:
        start = time.perf_counter()
        launched.append(time.time_ns())
        x.add_(1)
        if stamp is not None:
            stamp(slot)
        submitted.append(time.time_ns())
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)

    rng = random.Random(args.seed)
    for i in range(args.trials):
        time.sleep(rng.uniform(0.005, 0.015))
        if args.prep_ms is None:
            trial(i)
        else:
            with gpreempt.request():
                _spin(args.prep_ms / 1e3)
                trial(i)
    found: dict[str, list[float] | None] = {"round_trips_ms": samples}
    if stamp is not None:  # the stamps on the host's clock, from the launch and from its return
        on_host = [g + offset for g in stamp.out.tolist()]
        for key, host in (("starts_ms", launched), ("queued_ms", submitted)):
            found[key] = [(g - h) / 1e6 for g, h in zip(on_host, host, strict=True)]
    Path(args.result).write_text(json.dumps(found))


# ------------------------------------------------------------------------- orchestration
def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wait(path: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path.name} did not appear within {timeout:.0f} s")
        time.sleep(0.1)


def run(args: argparse.Namespace) -> None:
    leads = [float(p) for p in args.prep_ms.split(",")]
    modes: list[float | None] = [None, *leads]
    counts = [int(n) for n in args.trainers.split(",")]
    results: dict = {
        "trials": args.trials,
        "serve_args": args.serve_args,
        "mps": args.mps,
        "settings": [],
    }
    mps = MpsDaemon(Path(tempfile.mkdtemp(prefix="gp-mps-"))) if args.mps else None
    try:
        if mps is not None:
            mps.start()
            os.environ.update(mps.env())
        for budget in [float(b) for b in args.budgets.split(",")]:
            _run_budget(args, budget, counts, modes, results)
    finally:
        if mps is not None:
            mps.stop()
    _summarise(args, results)


def _run_budget(
    args: argparse.Namespace,
    budget: float,
    counts: list[int],
    modes: list[float | None],
    results: dict,
) -> None:
    """Every trainer count and mode under one daemon with in-flight budget ``budget`` ms."""
    work = Path(tempfile.mkdtemp(prefix="gp-probe-"))
    runtime = work / "rt"
    runtime.mkdir(mode=0o700)
    env = _env(runtime)
    serve = _gp(
        runtime, "serve", "--inflight-budget-ms", str(budget), *shlex.split(args.serve_args)
    )
    daemon = subprocess.Popen(serve, env=env, stderr=open(work / "serve.log", "w"))  # noqa: SIM115
    try:
        time.sleep(2)
        for count in counts:
            trainers = []
            for i in range(count):
                ready = work / f"ready-{count}-{i}"
                cmd = _gp(runtime, "run")
                cmd += ["--priority", "low", "--mechanism", "gate", "--name", f"trainer-{i}", "--"]
                cmd += [sys.executable, str(HERE), "train", "--ready", str(ready)]
                trainer_env = {**env, "CUDA_MPS_CLIENT_PRIORITY": "1"} if args.mps else env
                trainers.append((subprocess.Popen(cmd, env=trainer_env), ready))
            try:
                for _proc, ready in trainers:
                    _wait(ready, 180)
                for prep in modes:
                    setting = _probe(args, env, runtime, work, prep)
                    results["settings"].append({"budget_ms": budget, "trainers": count, **setting})
                    p50 = _percentile(setting["samples_ms"], 0.5)
                    print(f"budget={budget:g} trainers={count} {setting['mode']}: p50 {p50:.3f} ms")
            finally:
                for proc, _ready in trainers:
                    proc.send_signal(signal.SIGTERM)
                for proc, _ready in trainers:
                    proc.wait(60)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


def _probe(
    args: argparse.Namespace,
    env: dict[str, str],
    runtime: Path,
    work: Path,
    prep: float | None,
) -> dict:
    """One prober run in one mode: its name and round trips."""
    mode = "no-hint" if prep is None else f"hint-{prep:g}"
    result = work / f"probe-{mode}.json"
    cmd = _gp(runtime, "run") + ["--priority", "high", "--name", "prober", "--"]
    cmd += [sys.executable, str(HERE), "probe", "--trials", str(args.trials)]
    cmd += ["--result", str(result)]
    cmd += [] if prep is None else ["--prep-ms", str(prep)]
    subprocess.run(cmd, env=env, check=True, timeout=600)
    found = json.loads(result.read_text())
    return {
        "mode": mode,
        "samples_ms": found["round_trips_ms"],
        **{key: found.get(key) for key in _STAMPED},
    }


def _summarise(args: argparse.Namespace, results: dict) -> None:
    """Waits (round trip, GPU start and time queued, each minus its median with no trainer,
    same budget and mode); a table."""
    keys = ("samples_ms", *_STAMPED)
    alone: dict[tuple, dict[str, float]] = {}
    for s in results["settings"]:
        if s["trainers"] == 0:
            alone[(s["budget_ms"], s["mode"])] = {
                key: _percentile(s[key], 0.5) for key in keys if s.get(key)
            }
    rows = []
    for s in results["settings"]:
        base = alone.get((s["budget_ms"], s["mode"]), {})
        v = s["samples_ms"]
        row = {
            "budget_ms": s["budget_ms"],
            "trainers": s["trainers"],
            "mode": s["mode"],
            "round_trip_p50_ms": _percentile(v, 0.5),
            "round_trip_p99_ms": _percentile(v, 0.99),
        }
        for key, name in zip(keys, ("wait", "start_wait", "queued_wait"), strict=True):
            if s.get(key):
                zero = base.get(key, 0.0)
                row[f"{name}_p50_ms"] = _percentile(s[key], 0.5) - zero
                row[f"{name}_p99_ms"] = _percentile(s[key], 0.99) - zero
        for key in _STAMPED:
            if s.get(key):
                row[f"{key[:-3]}_p50_ms"] = _percentile(s[key], 0.5)
                row[f"{key[:-3]}_p99_ms"] = _percentile(s[key], 0.99)
        rows.append(row)
    results["summary"] = rows
    Path(args.out).write_text(json.dumps(results, indent=1))
    print("ms, P50 / P99; waits are minus the median with no trainer, queued is as measured")
    header = ("budget", "trainers", "mode", "rt p50", "rt p99", "wait", "start wait")
    header += ("queued wait", "queued")
    print("{:>6} {:>8} {:>8} {:>7} {:>7} {:>13} {:>13} {:>13} {:>13}".format(*header))
    for r in rows:
        waits = [
            f"{r[f'{name}_p50_ms']:.3f} / {r[f'{name}_p99_ms']:.3f}"
            if f"{name}_p50_ms" in r
            else "-"
            for name in ("wait", "start_wait", "queued_wait", "queued")
        ]
        print(
            f"{r['budget_ms']:>6g} {r['trainers']:>8} {r['mode']:>8} "
            f"{r['round_trip_p50_ms']:>7.3f} {r['round_trip_p99_ms']:>7.3f} "
            + " ".join(f"{w:>13}" for w in waits)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    p = sub.add_parser("train")
    p.add_argument("--ready", required=True)
    p.set_defaults(fn=train)
    p = sub.add_parser("probe")
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--prep-ms", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", required=True)
    p.set_defaults(fn=probe)
    parser.add_argument("--out", default="first_kernel.json")
    parser.add_argument("--trainers", default="0,1,3", help="trainer counts (default 0,1,3)")
    parser.add_argument("--prep-ms", default="0,0.5,1", help="CPU preparation after the hint")
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument(
        "--budgets",
        default=f"{DEFAULT_BUDGET_MS:g}",
        help=f"daemon in-flight budgets, ms per GPU (default {DEFAULT_BUDGET_MS:g}, the daemon's)",
    )
    parser.add_argument("--serve-args", default="", help="more options for `gpreempt serve`")
    parser.add_argument(
        "--mps", action="store_true", help="run every process under a private MPS daemon"
    )
    parser.set_defaults(fn=run)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
