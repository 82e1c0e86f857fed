"""``gpreempt bench``: Case-A latency and Case-B throughput under every way of sharing a GPU.

Layers (torch only in :mod:`.workloads`' builders, matplotlib only in :mod:`.plots`):

- :mod:`.load`, :mod:`.stats`, :mod:`.daemon_events`, :mod:`.scenario_metrics`,
  :mod:`.memory_pressure`: pure computation (and the memory scenarios' plan);
- :mod:`.loops`, :mod:`.workloads`: the benchmark processes (serve, train) and their handshake;
- :mod:`.scenarios`, :mod:`.mps`, :mod:`.gpu_sampler`, :mod:`.device`: starting and watching
  processes;
- :mod:`.runner`, :mod:`.report`, :mod:`.plots`, :mod:`.gpu_demo`, :mod:`.cpu_demo`: a whole
  run and its outputs.
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
