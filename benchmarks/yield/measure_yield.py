"""Cost of the cooperative-yield calls and of request() in a process under a daemon.

    python benchmarks/yield/measure_yield.py OUT.json

Starts a private daemon and a low-priority process registered with it (gpreempt.attach) that
times, per call: should_yield() and yield_point() with the gate open, and a request() scope
(which rings the daemon's doorbell on entry and exit). Then an idle high-priority process of
the same user registers too; the low one watches it (the daemon sends it that process's control
block) and times should_yield() again. CPU only: no GPU work is involved in these calls. The
two processes are siblings: a process started by a task belongs to that task.
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

HIGH = """
import sys, time, gpreempt
gpreempt.attach("high", name="idle-server", runtime_dir=sys.argv[1], gate=False)
time.sleep(120)
"""


def per_call_ns(fn, n: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - start) / n


def best_ns(fn, n: int) -> float:
    return min(per_call_ns(fn, n) for _ in range(3))


def measure(runtime_dir: Path, out: Path) -> None:
    """The low-priority process: the timings, before and after the high one registers."""
    current = gpreempt.attach("low", name="yield-bench", runtime_dir=runtime_dir, gate=False)

    def one_request() -> None:
        with gpreempt.request():
            pass

    results = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "should_yield_ns": best_ns(gpreempt.should_yield, 200_000),
        "yield_point_open_ns": best_ns(gpreempt.yield_point, 200_000),
        "request_scope_us": best_ns(one_request, 5_000) / 1e3,
    }
    (runtime_dir / "low-phase-1").touch()  # the orchestrator starts the high process now
    deadline = time.monotonic() + 20
    while not current._watched and time.monotonic() < deadline:
        time.sleep(0.01)
    results["watched_blocks"] = len(current._watched)
    results["should_yield_watching_one_ns"] = best_ns(gpreempt.should_yield, 200_000)
    out.write_text(json.dumps(results, indent=1))


def main() -> None:
    if sys.argv[1:2] == ["--low"]:
        measure(Path(sys.argv[2]), Path(sys.argv[3]))
        return
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
        low = subprocess.Popen([sys.executable, __file__, "--low", str(runtime_dir), str(out)])
        while not (runtime_dir / "low-phase-1").exists() and low.poll() is None:
            time.sleep(0.01)
        high = subprocess.Popen([sys.executable, "-c", HIGH, str(runtime_dir)])
        try:
            if low.wait(300) != 0:
                raise SystemExit("the measuring process failed")
        finally:
            high.terminate()
            high.wait(10)
    finally:
        daemon.terminate()
        daemon.wait(10)
    print(out.read_text())


if __name__ == "__main__":
    main()
