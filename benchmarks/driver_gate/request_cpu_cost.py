"""What ``gpreempt.request()`` costs a server's CPU, under a daemon, with no GPU.

A stand-in server runs under ``gpreempt run --priority high`` beside a private daemon. Each of
its requests does about ``--work-ms`` of work that releases the interpreter lock (hashing; a
CUDA stream's synchronize releases it too while it waits), marked with ``request()`` or not;
between them it waits as long again ("idle": every request starts with the server idle) or only
before every eighth ("queued": the others start right after the one before, as a queue's do).
Per request it times entering the scope, its work, and leaving the scope (the work too: helper
threads woken by the scope can take the interpreter lock from it). It prints, per mode
(``noreq``: unmarked; ``req``: ``request()``; ``pyreq``: ``request()`` counted by the Python
linger, as where the native counter cannot be built; ``linger0``: ``request()`` with
``GPREEMPT_REQUEST_LINGER_MS=0``) and pattern, the range over interleaved rounds of each
round's medians; ``--out`` keeps every round's.

    python3 benchmarks/driver_gate/request_cpu_cost.py [--rounds 3] [--requests 2000]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MODES = ("noreq", "req", "pyreq", "linger0")
PATTERNS = ("idle", "queued")
_CHUNK = bytes(64 << 10)  # hashing this releases the interpreter lock


def _work_for(seconds: float) -> Callable[[], None]:
    """Work of about ``seconds`` that releases the interpreter lock, calibrated here."""
    began, n = time.perf_counter(), 0
    while time.perf_counter() - began < 0.05:
        hashlib.sha256(_CHUNK).digest()
        n += 1
    chunks = max(1, round(seconds / ((time.perf_counter() - began) / n)))

    def work() -> None:
        for _ in range(chunks):
            hashlib.sha256(_CHUNK).digest()

    return work


def serve(mode: str, pattern: str, requests: int, work_ms: float) -> dict[str, float]:
    """The stand-in server's loop (in the task's process): medians in microseconds."""
    import gpreempt
    from gpreempt.client.native_scopes import NativeScopes

    mark = contextlib.nullcontext if mode == "noreq" else gpreempt.request
    work = _work_for(work_ms / 1e3)
    enter, inside, leave = [], [], []
    for i in range(requests):
        if pattern == "idle" or i % 8 == 0:
            work()  # the gap between requests, the lock released as in a real wait
        t0 = time.perf_counter()
        scope = mark()
        scope.__enter__()
        t1 = time.perf_counter()
        work()
        t2 = time.perf_counter()
        scope.__exit__(None, None, None)
        t3 = time.perf_counter()
        enter.append(t1 - t0)
        inside.append(t2 - t1)
        leave.append(t3 - t2)
    current = gpreempt.client.session.current()
    return {
        "native": current is not None and isinstance(current.scopes, NativeScopes),
        "enter_us": statistics.median(enter) * 1e6,
        "work_us": statistics.median(inside) * 1e6,
        "exit_us": statistics.median(leave) * 1e6,
    }


def _env() -> dict[str, str]:
    """The environment of the daemon and the servers: this tree's gpreempt, no linger set."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    env.pop("GPREEMPT_REQUEST_LINGER_MS", None)
    return env


def _one(
    runtime: str, mode: str, pattern: str, requests: int, work_ms: float, empty_cache: str
) -> dict:
    env = _env()
    if mode == "linger0":
        env["GPREEMPT_REQUEST_LINGER_MS"] = "0"
    if mode == "pyreq":  # nothing to load and no compiler: the Python linger counts
        env.update(CXX="no-such-compiler", GPREEMPT_CACHE_DIR=empty_cache)
    cmd = [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", runtime, "--priority",
           "high", "--", sys.executable, __file__, "--serve", mode, pattern,
           "--requests", str(requests), "--work-ms", str(work_ms)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"request_cpu_cost: the {mode} {pattern} server failed: "
                         f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")  # fmt: skip
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--work-ms", type=float, default=1.3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--serve", nargs=2, metavar=("MODE", "PATTERN"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests < 8 or not args.work_ms > 0:
        parser.error("--rounds must be 1 or more, --requests 8 or more, --work-ms more than 0")
    if args.serve:
        mode, pattern = args.serve
        print(json.dumps(serve(mode, pattern, args.requests, args.work_ms)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpreempt-reqcost-") as runtime:
        empty_cache = os.path.join(runtime, "no-cache")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", runtime],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for rnd in range(args.rounds):
                for pattern in PATTERNS:
                    for mode in MODES:
                        row = {"round": rnd, "mode": mode, "pattern": pattern}
                        row.update(
                            _one(runtime, mode, pattern, args.requests, args.work_ms, empty_cache)
                        )
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{'pattern':8s} {'mode':8s} {'enter us':>14s} {'work us':>16s} {'exit us':>14s}"
          "  counter")  # fmt: skip
    for pattern in PATTERNS:
        for mode in MODES:
            mine = [r for r in rows if r["mode"] == mode and r["pattern"] == pattern]
            cells = []
            for key in ("enter_us", "work_us", "exit_us"):
                values = [r[key] for r in mine]
                cells.append(f"{min(values):.1f}-{max(values):.1f}")
            counter = "-" if mode == "noreq" else "native" if mine[0]["native"] else "python"
            print(f"{pattern:8s} {mode:8s} {cells[0]:>14s} {cells[1]:>16s} {cells[2]:>14s}"
                  f"  {counter}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
