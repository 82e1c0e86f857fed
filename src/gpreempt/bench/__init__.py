"""``gpreempt bench``: Case-A latency and Case-B throughput under every way of sharing a GPU.

Open :mod:`.runner` first: a whole run (calibrate Case-A, fix the arrivals, run and repeat
every scenario, write results.json, report.md and the plots). Then, by what they do (torch only
in :mod:`.builtin_workloads`, matplotlib only in :mod:`.plots`):

- the scenarios: :mod:`.scenario_catalog` (their names and setups), :mod:`.scenarios` (running
  one), :mod:`.workload_argv` (its processes' command lines), :mod:`.child_process`,
  :mod:`.private_daemon`, :mod:`.mps`, :mod:`.gpu_sampler`, :mod:`.device`;
- the benchmark processes: :mod:`.workloads` (``python -m gpreempt.bench.workloads``),
  :mod:`.builtin_workloads` (ResNet-50 server, Transformer trainer), :mod:`.loops` (serving,
  training and the handshake with the harness);
- pure computation: :mod:`.load` (arrivals), :mod:`.stats`, :mod:`.daemon_events` (the
  daemon's event log), :mod:`.scenario_metrics` (latency ratios, B kept),
  :mod:`.memory_pressure` (the memory scenarios' plan);
- outputs: :mod:`.report`, :mod:`.plots`;
- the demos behind ``gpreempt demo``: :mod:`.gpu_demo` (a short run of this benchmark) and
  :mod:`.cpu_demo` (the same scenario on one CPU core, mechanism signal).
"""

from __future__ import annotations

from .load import arrival_rate, poisson_arrivals
from .runner import BenchConfig, run_bench
from .scenario_catalog import ALL_SCENARIOS, DEFAULT_SCENARIOS
from .workload_argv import Workloads

__all__ = [
    "ALL_SCENARIOS",
    "DEFAULT_SCENARIOS",
    "BenchConfig",
    "Workloads",
    "arrival_rate",
    "poisson_arrivals",
    "run_bench",
]
