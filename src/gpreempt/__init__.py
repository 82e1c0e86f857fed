"""gpreempt: latency-critical GPU work preempts best-effort GPU work on shared GPUs."""

from __future__ import annotations

__version__ = "0.1.0"

from .client.activity import request, should_yield, yield_point
from .client.api import attach, evict, restore, resume, status, suspend
from .client.scheduler import GPUScheduler
from .errors import (
    DaemonUnavailable,
    GpreemptError,
    MechanismUnavailable,
    NoSuchTask,
    PermissionDenied,
    PriorityError,
    UsageError,
)
from .priority import parse_priority

__all__ = [
    "DaemonUnavailable",
    "GPUScheduler",
    "GpreemptError",
    "MechanismUnavailable",
    "NoSuchTask",
    "PermissionDenied",
    "PriorityError",
    "UsageError",
    "__version__",
    "attach",
    "evict",
    "parse_priority",
    "request",
    "restore",
    "resume",
    "should_yield",
    "status",
    "suspend",
    "yield_point",
]
