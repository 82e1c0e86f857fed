"""The memory-pressure scenarios' plan: how much memory Case-B holds and Case-A asks for.

Case-B (case-b-0) holds a *ballast* tensor beside its model, so that little GPU memory is left
free. In the middle of its window Case-A grows its working set by more than is free, in chunks,
inside ``gpreempt.request()``. Under gpreempt (``memory-pressure``) Case-A runs with
``gpreempt run --reserve-memory`` of a small headroom: its first chunks use up the free memory,
the free memory drops below the reserve while Case-A is active, and the daemon evicts Case-B to
the host; Case-A waits for room (up to ``wait_s``) and gets its memory. Without gpreempt
(``memory-pressure-baseline``) nothing makes room and Case-A's growth fails with out-of-memory
at once, as a server's would.

Sizes come from the GPU's free memory before the scenario starts (``torch.cuda.mem_get_info``
in a child process, so the harness holds no CUDA context). Pure code: the probe's answer and
the user's options in, a plan (or the reason there can be none) out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import UsageError

GIB = 1 << 30
#: Less free memory than this and the plan is refused (models, contexts and both sides' sizes).
MIN_FREE_BYTES = 8 * GIB
#: Defaults: fractions of the free memory at the start.
BALLAST_FRACTION = 0.5
GROWTH_FRACTION = 0.5
#: Case-A's reserve (``--reserve-memory``): headroom below which the daemon makes room.
DEFAULT_RESERVE_BYTES = 2 * GIB
#: What Case-A itself needs beside its growth (model, CUDA graph, context), for the plan check.
CASE_A_ESTIMATE_BYTES = 1 * GIB
#: Case-A allocates its growth in chunks of this size.
CHUNK_BYTES = 512 << 20
#: How long Case-A under gpreempt waits for room before it reports out-of-memory.
WAIT_S = 60.0
#: After Case-A's window: how long to wait for Case-B's restore, and to watch it progress after.
RESTORE_TIMEOUT_S = 120.0
SETTLE_S = 3.0


@dataclass(frozen=True)
class MemoryPlan:
    """Sizes (bytes) and timings of one run's memory-pressure scenarios."""

    free_bytes: int  # free on the GPU before the scenario's processes start
    total_bytes: int
    ballast_bytes: int  # held by case-b-0 beside its model
    growth_bytes: int  # Case-A's working-set growth
    reserve_bytes: int  # Case-A's --reserve-memory
    growth_at_s: float  # the growth comes at the first request due this long into the window
    chunk_bytes: int = CHUNK_BYTES
    wait_s: float = WAIT_S  # under gpreempt; the baseline fails at the first out-of-memory
    settle_s: float = SETTLE_S
    restore_timeout_s: float = RESTORE_TIMEOUT_S
    problem: str | None = None  # why this GPU cannot run the plan
    checkpoint_problem: str | None = None  # why gpreempt cannot evict here (driver API)

    def as_dict(self) -> dict[str, Any]:
        """The plan in GiB for results.json."""
        data = asdict(self)
        for key in ("free", "total", "ballast", "growth", "reserve", "chunk"):
            data[f"{key}_gib"] = round(data.pop(f"{key}_bytes") / GIB, 3)
        return data

    def reserve_option(self) -> str:
        """``--reserve-memory`` value for ``gpreempt run`` (exact, in MiB)."""
        return f"{self.reserve_bytes // (1 << 20)}MiB"


def _gib(value: float | None, name: str) -> int | None:
    if value is None:
        return None
    if not value > 0:
        raise UsageError(f"{name} must be a positive number of GiB, got {value}")
    return int(value * GIB)


def make_plan(
    probe: dict[str, Any],
    span_s: float,
    ballast_gib: float | None = None,
    growth_gib: float | None = None,
    reserve_gib: float | None = None,
    growth_at_s: float | None = None,
    settle_s: float = SETTLE_S,
) -> MemoryPlan:
    """The plan for a GPU whose probe answered ``probe`` ({free, total, checkpoint_api,
    checkpoint_error, error}); ``span_s`` is how long Case-A's arrivals last (the growth comes
    a third of the way in unless ``growth_at_s`` says otherwise).

    Bad option values raise UsageError; a GPU that cannot run the plan gives a plan whose
    ``problem`` says why (the scenarios are then reported invalid, the run goes on).
    """
    ballast = _gib(ballast_gib, "--ballast-gib")
    growth = _gib(growth_gib, "--growth-gib")
    reserve = _gib(reserve_gib, "--reserve-gib")
    if growth_at_s is not None and growth_at_s < 0:
        raise UsageError(f"--growth-at-s must be >= 0, got {growth_at_s}")
    free = int(probe.get("free") or 0)
    total = int(probe.get("total") or 0)
    checkpoint = None
    if not probe.get("checkpoint_api"):
        checkpoint = (
            "the NVIDIA driver checkpoint API is missing "
            "(gpreempt.mechanisms.cuda_driver.try_driver() is None: "
            f"{probe.get('checkpoint_error') or 'no reason given'}); gpreempt cannot evict "
            "Case-B's memory here (driver r570 or newer is needed)"
        )
    plan = MemoryPlan(
        free_bytes=free,
        total_bytes=total,
        ballast_bytes=ballast if ballast is not None else int(free * BALLAST_FRACTION),
        growth_bytes=growth if growth is not None else int(free * GROWTH_FRACTION),
        reserve_bytes=reserve if reserve is not None else DEFAULT_RESERVE_BYTES,
        growth_at_s=growth_at_s if growth_at_s is not None else span_s / 3.0,
        settle_s=settle_s,
        checkpoint_problem=checkpoint,
    )
    return MemoryPlan(**{**asdict(plan), "problem": plan_problem(plan, probe.get("error"))})


def plan_problem(plan: MemoryPlan, probe_error: str | None = None) -> str | None:
    """Why the GPU lacks memory for ``plan`` (None when it fits)."""
    free = plan.free_bytes / GIB
    if probe_error or plan.free_bytes <= 0:
        return f"cannot read GPU 0's free memory ({probe_error or 'no answer'})"
    if plan.free_bytes < MIN_FREE_BYTES:
        return (
            f"GPU 0 has only {free:.1f} GiB free; the memory-pressure plan needs at least "
            f"{MIN_FREE_BYTES / GIB:.0f} GiB"
        )
    if plan.ballast_bytes >= plan.free_bytes:
        return (
            f"Case-B's ballast ({plan.ballast_bytes / GIB:.1f} GiB) does not fit in the "
            f"{free:.1f} GiB free: lower --ballast-gib"
        )
    need = plan.growth_bytes + plan.reserve_bytes + CASE_A_ESTIMATE_BYTES
    if need > plan.free_bytes:
        return (
            f"Case-A's growth ({plan.growth_bytes / GIB:.1f} GiB) plus its reserve "
            f"({plan.reserve_bytes / GIB:.1f} GiB) and model (about "
            f"{CASE_A_ESTIMATE_BYTES / GIB:.0f} GiB) would not fit even with Case-B evicted "
            f"({free:.1f} GiB free): lower --growth-gib or --reserve-gib"
        )
    if plan.reserve_bytes >= plan.free_bytes - plan.ballast_bytes:
        return (
            f"Case-A's reserve ({plan.reserve_bytes / GIB:.1f} GiB) is not below the memory left "
            f"beside the ballast ({(plan.free_bytes - plan.ballast_bytes) / GIB:.1f} GiB): "
            "Case-B would be evicted before the growth; lower --reserve-gib or --ballast-gib"
        )
    return None


_PROBE = r"""
import json
info = {}
try:
    import torch
    free, total = torch.cuda.mem_get_info(0)
    info.update(free=int(free), total=int(total))
except Exception as exc:
    info["error"] = f"torch.cuda.mem_get_info failed: {exc}"
try:
    from gpreempt.mechanisms.cuda_driver import CheckpointDriver
    CheckpointDriver.get()
    info["checkpoint_api"] = True
except Exception as exc:
    info["checkpoint_api"] = False
    info["checkpoint_error"] = str(exc)
print(json.dumps(info))
"""


def probe_gpu(python: str = sys.executable, env: dict[str, str] | None = None) -> dict[str, Any]:
    """{free, total, checkpoint_api, checkpoint_error?, error?} of GPU 0, from a child process
    (the harness itself never holds a CUDA context)."""
    try:
        result = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env
        )
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        return {"error": f"the memory probe failed: {exc}", "checkpoint_api": False}
