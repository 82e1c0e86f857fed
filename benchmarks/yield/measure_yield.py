"""Cost of the cooperative-yield calls and of request() in a process under a daemon.

    python benchmarks/yield/measure_yield.py OUT.json

Starts a private daemon, registers this process (gpreempt.attach), and times, per call:
should_yield() and yield_point() with the gate open, and a request() scope (which rings the
daemon's doorbell on entry and exit). CPU only: no GPU work is involved in these calls.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpreempt
from gpreempt.client.connection import DaemonClient


def per_call_ns(fn, n: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - start) / n


def main() -> None:
    out = Path(sys.argv[1])
    runtime_dir = Path(tempfile.mkdtemp(prefix="gp-yield-"))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime_dir)],
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                DaemonClient.connect(runtime_dir).close()
                break
            except gpreempt.DaemonUnavailable:
                time.sleep(0.05)
        gpreempt.attach("low", name="yield-bench", runtime_dir=runtime_dir, gate=False)

        def one_request() -> None:
            with gpreempt.request():
                pass

        results = {
            "machine": platform.machine(),
            "python": platform.python_version(),
            "should_yield_ns": min(per_call_ns(gpreempt.should_yield, 200_000) for _ in range(3)),
            "yield_point_open_ns": min(
                per_call_ns(gpreempt.yield_point, 200_000) for _ in range(3)
            ),
            "request_scope_us": min(per_call_ns(one_request, 5_000) for _ in range(3)) / 1e3,
        }
    finally:
        daemon.terminate()
        daemon.wait(10)
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
