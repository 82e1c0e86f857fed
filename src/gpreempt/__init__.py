"""gpreempt: latency-critical GPU work preempts best-effort GPU work on shared GPUs."""

from __future__ import annotations

__version__ = "0.1.0"
