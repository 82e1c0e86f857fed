"""The launch gate's settings: one frozen object with one set of names and defaults.

:class:`GateConfig` is the only place the gate's knobs are named and given their defaults. The
Python fallback reads it directly, and the C++ extension reads the very same fields by name
when it is installed (``config_from`` in ``csrc/operator_gate_install.cpp``), so both
implementations run with the same numbers. :func:`resolve_config` builds one from explicit
parameters, the environment (``GPREEMPT_GATE_*``) and the defaults, in that order of precedence.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from ...config import DEFAULT_BOUND_IDLE_GRACE_MS, env_number, env_switch
from ...errors import UsageError

ENV_K = "GPREEMPT_GATE_K"
ENV_W = "GPREEMPT_GATE_W"
ENV_WINDOW_MS = "GPREEMPT_GATE_WINDOW_MS"
ENV_OPEN_WINDOW_MS = "GPREEMPT_GATE_OPEN_WINDOW_MS"
ENV_MODE = "GPREEMPT_GATE_MODE"
ENV_HOLD_MS = "GPREEMPT_GATE_HOLD_MS"
ENV_NATIVE = "GPREEMPT_GATE_NATIVE"
#: The line a process prints where its gate is the Python fallback (its C++ part could not be
#: built), before the reason; ``gpreempt selftest`` looks for it.
SLOW_GATE_NOTICE = "gpreempt: using the slow Python launch gate"
ENV_OP_COSTS = "GPREEMPT_GATE_OP_COSTS"
ENV_BARRIER_MS = "GPREEMPT_GATE_BARRIER_MS"

#: The window's modes: tight while someone more important is around (adaptive), or always one.
MODES = ("adaptive", "tight", "open")

#: Launches between two events while the window is tight (``K``).
DEFAULT_RECORD_EVERY = 32
#: Events outstanding at most while tight (``W``): ``K * W`` launches in flight.
DEFAULT_EVENTS = 4
#: Launches between two events while the window is open: at least this many.
MIN_OPEN_RECORD_EVERY = 128
#: Events outstanding at most while open: ``open_record_every * 32`` launches in flight.
OPEN_EVENTS = 32
#: GPU time in flight at most while tight.
DEFAULT_WINDOW_MS = 1.0
#: GPU time in flight at most while open (bounds the drain when the gate first closes).
DEFAULT_OPEN_WINDOW_MS = 25.0
#: How long the window stays tight after the gate was last closed.
DEFAULT_HOLD_MS = 1000.0
#: Quiet time after the last GPU work before ``auto_active`` drops back to 0 (the default of a
#: task that may be preempted; ``gpreempt run`` passes the one for its priority).
DEFAULT_IDLE_GRACE_MS = DEFAULT_BOUND_IDLE_GRACE_MS
#: Stream barrier spacing (GPU time) for tasks under ``gpreempt run`` that may be preempted.
#: Each barrier stalls the stream's front end between two kernels (about 3.3 us on an H100),
#: so closer barriers cost the trainer more than they save the server: beside a graph server,
#: 0.2 ms kept an eager trainer 0.02-0.03 more than 0.1 ms, with the server's tail no worse
#: (docs/results.md, "The driver-level gate").
RUN_BARRIER_MS = 0.2
#: Sleep per poll while a watched task is active (or a task word is set).
POLL_US = 30.0
#: While a gate sleeps (docs/gate.md, "Barriers while asleep"): wall time between two stream
#: barriers put by its sleep thread; what a starting request may wait for on average before the
#: gate wakes; how long it then stays awake.
ASLEEP_BARRIER_MS = 1.0
ASLEEP_MAX_DRAIN_MS = 2.0
BACKLOG_HOLD_S = 10.0


@dataclass(frozen=True)
class GateConfig:
    """The settings a gate runs with, after parameters and environment are resolved.

    The defaults are those of a gate with nothing set; :func:`resolve_config` derives the
    launch counts from ``record_every`` as these defaults are derived from
    :data:`DEFAULT_RECORD_EVERY`. Bad values raise UsageError.
    """

    bound: bool  # bound the in-flight work (tasks that may be preempted)
    auto_activity: bool  # publish auto_active from the launches (tasks that preempt)
    record_every: int = DEFAULT_RECORD_EVERY  # K: launches per CUDA event while tight
    window_launches: int = DEFAULT_RECORD_EVERY * DEFAULT_EVENTS  # in flight at most while tight
    window_ms: float = DEFAULT_WINDOW_MS  # GPU time in flight at most while tight; 0 = count only
    open_record_every: int = MIN_OPEN_RECORD_EVERY  # launches per CUDA event while open
    open_window_launches: int = MIN_OPEN_RECORD_EVERY * OPEN_EVENTS  # in flight at most, open
    open_window_ms: float = DEFAULT_OPEN_WINDOW_MS  # GPU time in flight at most while open
    tight_hold_ms: float = DEFAULT_HOLD_MS  # stay tight this long after the gate last closed
    mode: str = "adaptive"  # adaptive | tight | open
    idle_grace_ms: float = DEFAULT_IDLE_GRACE_MS  # quiet time before auto_active drops to 0
    op_costs: bool = True  # count each operator at its own timed cost (native gate only)
    #: GPU time between two stream barriers (native gate, NVIDIA); 0 = no barriers
    barrier_ms: float = 0.0
    #: sleep per poll while a watched task is active or a task word is set
    poll_us: float = POLL_US
    #: asleep with barriers: their spacing (wall time), the expected wait for a starting
    #: request above which the gate wakes, and how long it then stays awake
    asleep_barrier_ms: float = ASLEEP_BARRIER_MS
    asleep_max_drain_ms: float = ASLEEP_MAX_DRAIN_MS
    backlog_hold_s: float = BACKLOG_HOLD_S

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"gate mode {self.mode!r} is not one of {', '.join(MODES)}")
        for label in ("record_every", "window_launches", "open_window_launches"):
            if getattr(self, label) < 1:
                raise UsageError(f"{label} must be >= 1, got {getattr(self, label)}")
        if self.open_record_every < 1:
            raise UsageError(f"open_record_every must be >= 1, got {self.open_record_every}")
        if not 0 <= self.barrier_ms < math.inf:
            raise UsageError(
                f"barrier_ms must be a finite number of ms, 0 or more, not {self.barrier_ms}"
            )
        if min(self.window_ms, self.open_window_ms, self.tight_hold_ms, self.idle_grace_ms) < 0:
            raise UsageError(
                "window_ms, open_window_ms, tight_hold_ms and idle_grace_ms must be >= 0"
            )
        if not self.poll_us > 0:
            raise UsageError(f"poll_us must be > 0, got {self.poll_us}")
        for label in ("asleep_barrier_ms", "asleep_max_drain_ms", "backlog_hold_s"):
            if not 0 < getattr(self, label) < math.inf:
                raise UsageError(f"{label} must be a finite number > 0, not {getattr(self, label)}")


def _pick(explicit: Any, env: Any, default: Any) -> Any:
    if explicit is not None:
        return explicit
    if env is not None:
        return env
    return default


def resolve_config(
    *,
    bound: bool,
    auto_activity: bool,
    record_every: int | None = None,
    window_launches: int | None = None,
    window_ms: float | None = None,
    open_window_ms: float | None = None,
    open_window_launches: int | None = None,
    tight_hold_ms: float | None = None,
    mode: str | None = None,
    idle_grace_ms: float = DEFAULT_IDLE_GRACE_MS,
    op_costs: bool | None = None,
    barrier_ms: float | None = None,
) -> GateConfig:
    """The gate's settings: parameters win over environment variables, which win over the
    defaults. A parameter left ``None`` is taken from the environment, else the default.

    ``bound``: bound this process's in-flight GPU work (tasks that may be preempted).
    ``auto_activity``: publish ``auto_active`` from this process's launches (tasks that preempt).
    ``window_launches`` / ``window_ms``: the tight window, in launches and in GPU time
    (defaults ``K*W`` = 128 and 1 ms; environment ``GPREEMPT_GATE_K``, ``GPREEMPT_GATE_W``,
    ``GPREEMPT_GATE_WINDOW_MS``). ``record_every``: K, launches per CUDA event while tight.
    ``open_window_ms`` (``GPREEMPT_GATE_OPEN_WINDOW_MS``, 25 ms): GPU time in flight while no
    more important task is around. ``tight_hold_ms`` (``GPREEMPT_GATE_HOLD_MS``, 1000): how long
    the window stays tight after the gate was last closed. ``mode`` (``GPREEMPT_GATE_MODE``):
    ``adaptive`` (default), or ``tight``/``open`` always. ``op_costs``
    (``GPREEMPT_GATE_OP_COSTS``, on): the native gate times operators now and then and counts
    each at its own GPU time, not at the average. ``barrier_ms`` (``GPREEMPT_GATE_BARRIER_MS``,
    0 = off here; :data:`RUN_BARRIER_MS` for tasks of mechanism ``gate``): every that much
    estimated GPU time, while the daemon gives the task an in-flight share (a more important
    task is registered on its GPU), the native gate of a bound task puts stream barriers on the
    current CUDA stream that hold its queued work on the GPU while a watched task is active or
    the daemon closed the gate; the CPU then keeps launching ahead instead of stopping. NVIDIA
    only (CUDA stream memory operations); ignored by the Python fallback.

    Raises UsageError for bad settings, naming the parameter or environment variable.
    """
    k = int(_pick(record_every, env_number(ENV_K, int, 1), DEFAULT_RECORD_EVERY))
    events = env_number(ENV_W, int, 1) or DEFAULT_EVENTS
    launches = int(_pick(window_launches, None, k * events))
    tight_ms = float(_pick(window_ms, env_number(ENV_WINDOW_MS, float, 0), DEFAULT_WINDOW_MS))
    open_ms = float(
        _pick(open_window_ms, env_number(ENV_OPEN_WINDOW_MS, float, 0), DEFAULT_OPEN_WINDOW_MS)
    )
    hold = float(_pick(tight_hold_ms, env_number(ENV_HOLD_MS, float, 0), DEFAULT_HOLD_MS))
    chosen_mode = _pick(mode, os.environ.get(ENV_MODE) or None, "adaptive")
    costs = _pick(op_costs, env_switch(ENV_OP_COSTS), True)
    barrier = float(_pick(barrier_ms, env_number(ENV_BARRIER_MS, float, 0), 0.0))
    open_k = max(k, MIN_OPEN_RECORD_EVERY)
    return GateConfig(
        bound=bound,
        auto_activity=auto_activity,
        record_every=k,
        window_launches=launches,
        window_ms=tight_ms,
        open_record_every=open_k,
        open_window_launches=int(open_window_launches or max(launches, OPEN_EVENTS * open_k)),
        open_window_ms=open_ms,
        tight_hold_ms=hold,
        mode=chosen_mode,
        idle_grace_ms=float(idle_grace_ms),
        op_costs=bool(costs),
        barrier_ms=barrier,
    )
