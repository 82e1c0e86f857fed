"""The in-process launch gate (L1): lets the daemon stop this process's GPU launches.

``install_gate`` hooks every PyTorch operator of the process. Before each one the gate reads the
control block's ``gate_closed`` word (one plain load: no syscall, no lock); while the word is
set it launches nothing. Optionally it also

* **bounds the work in flight** (``bound=True``, for tasks that may be preempted): it records a
  CUDA event every few launches and, when more work than the window is outstanding, waits for
  the oldest event. The window is counted both in launches and in GPU time learned from the
  events' timestamps. It is *tight* (``window_ms`` of GPU work) while a more important task is
  around -- from the moment the gate was last closed until ``tight_hold_ms`` later -- and *open*
  (``open_window_ms``) otherwise, because a tight window makes the CPU lockstep with the GPU and
  costs throughput while it protects nobody;
* **detects the process's own GPU activity** (``auto_activity=True``, for the tasks that preempt
  others): the first launch after idling publishes ``auto_active=1`` and rings the doorbell; a
  background thread publishes ``auto_active=0`` once all the work has completed and
  ``idle_grace_ms`` has passed.

The per-operator hook is a C++ ``RecordFunction`` callback built on first use (see
:mod:`gpreempt.client.gate_build`). Where no compiler is available a Python
``TorchDispatchMode`` does the same job at a much higher cost per operator, and only for the
thread that installed it (and the autograd threads that serve it).

Launches PyTorch operators do not make are invisible to the gate: kernels inside a CUDA graph
replay (the replay itself is gated when it goes through ``torch.cuda.CUDAGraph.replay``),
custom extensions calling CUDA directly. The daemon's driver lock backstops those.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .. import futex
from ..config import env_number, env_switch
from ..control import (
    OFF_AUTO_ACTIVE,
    OFF_GATE_CLOSED,
    OFF_GATE_INSTALLED,
    OFF_GENERATION,
    OFF_LAUNCHES,
    OFF_WAIT_NS,
    OFF_WAITS,
    OFF_WINDOW,
    OFF_WINDOW_SHARE_US,
    SIZE,
    ControlBlock,
    released_by_watch,
    words_want_gpu,
)
from ..errors import UsageError

ENV_K = "GPREEMPT_GATE_K"
ENV_W = "GPREEMPT_GATE_W"
ENV_WINDOW_MS = "GPREEMPT_GATE_WINDOW_MS"
ENV_OPEN_WINDOW_MS = "GPREEMPT_GATE_OPEN_WINDOW_MS"
ENV_MODE = "GPREEMPT_GATE_MODE"
ENV_HOLD_MS = "GPREEMPT_GATE_HOLD_MS"
ENV_NATIVE = "GPREEMPT_GATE_NATIVE"
ENV_OP_COSTS = "GPREEMPT_GATE_OP_COSTS"
ENV_BARRIER_MS = "GPREEMPT_GATE_BARRIER_MS"

MODES = ("adaptive", "tight", "open")

#: Launches between two events while the window is tight (``K``).
DEFAULT_RECORD_EVERY = 32
#: Events outstanding at most while tight (``W``): ``K * W`` launches in flight.
DEFAULT_EVENTS = 4
#: GPU time in flight at most while tight.
DEFAULT_WINDOW_MS = 1.0
#: GPU time in flight at most while open (bounds the drain when the gate first closes).
DEFAULT_OPEN_WINDOW_MS = 25.0
#: How long the window stays tight after the gate was last closed.
DEFAULT_HOLD_MS = 1000.0
#: Stream barrier spacing (GPU time) for tasks under ``gpreempt run --mechanism gate``. Each
#: barrier stalls the stream's front end between two kernels, so closer barriers cost the
#: trainer more than they save the server (docs/results.md, "How far apart the barriers").
RUN_BARRIER_MS = 0.1
#: Sleep per poll while a watched task is active (or a task word is set).
POLL_US = 30.0
#: Longest sleep at a gate the daemon closed (it wakes the sleepers as it opens the gate).
CLOSED_SLEEP_S = 0.001


@dataclass(frozen=True)
class GateConfig:
    """The settings a gate runs with, after parameters and environment are resolved."""

    bound: bool  # bound the in-flight work (tasks that may be preempted)
    auto_activity: bool  # publish auto_active from the launches (tasks that preempt)
    record_every: int  # K: launches per CUDA event while the window is tight
    window_launches: int  # launches in flight at most while tight (K * W)
    window_ms: float  # GPU time in flight at most while tight; 0 = count only
    open_record_every: int  # launches per CUDA event while the window is open
    open_window_launches: int  # launches in flight at most while open
    open_window_ms: float  # GPU time in flight at most while open; 0 = count only
    tight_hold_ms: float  # stay tight this long after the gate was last closed
    mode: str  # adaptive | tight | open
    idle_grace_ms: float  # quiet time before auto_active drops back to 0
    op_costs: bool = True  # count each operator at its own timed cost (native gate only)
    #: GPU time between two stream barriers (native gate, NVIDIA); 0 = no barriers
    barrier_ms: float = 0.0


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
    idle_grace_ms: float = 2.0,
    op_costs: bool | None = None,
    barrier_ms: float | None = None,
) -> GateConfig:
    """Parameters win over environment variables, which win over the defaults."""
    k = int(_pick(record_every, env_number(ENV_K, int, 1), DEFAULT_RECORD_EVERY))
    events = env_number(ENV_W, int, 1) or DEFAULT_EVENTS
    launches = int(_pick(window_launches, None, k * events))
    tight_ms = float(_pick(window_ms, env_number(ENV_WINDOW_MS, float, 0), DEFAULT_WINDOW_MS))
    open_ms = float(
        _pick(open_window_ms, env_number(ENV_OPEN_WINDOW_MS, float, 0), DEFAULT_OPEN_WINDOW_MS)
    )
    hold = float(_pick(tight_hold_ms, env_number(ENV_HOLD_MS, float, 0), DEFAULT_HOLD_MS))
    chosen_mode = _pick(mode, os.environ.get(ENV_MODE) or None, "adaptive")
    if chosen_mode not in MODES:
        raise UsageError(f"gate mode {chosen_mode!r} is not one of {', '.join(MODES)}")
    for label, value in (
        ("record_every", k),
        ("window_launches", launches),
        ("open_window_launches", open_window_launches or 1),
    ):
        if value < 1:
            raise UsageError(f"{label} must be >= 1, got {value}")
    costs = _pick(op_costs, env_switch(ENV_OP_COSTS), True)
    barrier = float(_pick(barrier_ms, env_number(ENV_BARRIER_MS, float, 0), 0.0))
    if not 0 <= barrier < math.inf:
        raise UsageError(f"barrier_ms must be a finite number of ms, 0 or more, not {barrier}")
    if tight_ms < 0 or open_ms < 0 or hold < 0 or idle_grace_ms < 0:
        raise UsageError("window_ms, open_window_ms, tight_hold_ms and idle_grace_ms must be >= 0")
    open_k = max(k, 128)
    return GateConfig(
        bound=bound,
        auto_activity=auto_activity,
        record_every=k,
        window_launches=launches,
        window_ms=tight_ms,
        open_record_every=open_k,
        open_window_launches=int(open_window_launches or max(launches, 32 * open_k)),
        open_window_ms=open_ms,
        tight_hold_ms=hold,
        mode=chosen_mode,
        idle_grace_ms=float(idle_grace_ms),
        op_costs=bool(costs),
        barrier_ms=barrier,
    )


class Gate:
    """An installed launch gate. One per process at a time."""

    #: True if the C++ hook is active, False for the Python fallback.
    native: bool
    config: GateConfig

    def __init__(self, control: ControlBlock, config: GateConfig, native: bool, impl: Any) -> None:
        self.control = control  # keeps the mapping alive as long as the gate
        self.config = config
        self.native = native
        self._impl = impl
        self._installed = True
        self._torch_patches = _TorchPatches(self)

    def uninstall(self) -> None:
        """Remove the hook; launches pass freely again. Safe to call twice."""
        global _current
        if not self._installed:
            return
        self._installed = False
        self._torch_patches.undo()
        self._impl.uninstall()
        with _install_lock:
            if _current is self:
                _current = None

    @property
    def installed(self) -> bool:
        return self._installed

    def stats(self) -> dict[str, Any]:
        """Counters: launches, waits, wait_seconds, bound_waits, window, tight, auto_active..."""
        out: dict[str, Any] = {"native": self.native}
        out.update(self._impl.stats())
        out["installed"] = self._installed
        out["config"] = asdict(self.config)
        return out

    def drain(self) -> None:
        """Wait until the GPU work this process launched so far has completed."""
        if self._installed:
            self._impl.drain()

    def warm(self) -> None:
        """Put a no-op kernel on the current CUDA stream. Entering a request does (with
        ``GPREEMPT_REQUEST_WARM=1``), so that the GPU switches from the other processes'
        contexts to this one while the request prepares, not at its first kernel. Nothing
        where CUDA is not initialised here or the stream is being captured (the kernel would
        join the graph)."""
        torch = sys.modules.get("torch")
        if not self._installed or torch is None or not _cuda_initialized(torch):
            return
        with contextlib.suppress(RuntimeError):  # a request never fails for it
            if not torch.cuda.is_current_stream_capturing():
                torch.cuda._sleep(0)

    def watch(self, addresses: Sequence[int], version: int = 0) -> None:
        """Also stop while one of these control blocks (mapped read-only at these addresses)
        says its task is active; replaces the previous list, ``[]`` clears it.

        The session calls it with what the daemon sends (the blocks of the tasks that outrank
        this one), so the gate stops at its next operator when one of them starts, without
        waiting for the daemon to close it. ``version``: the daemon's number for that list
        (0 = none, or not all of it mapped); a gate the daemon closed only while the tasks of
        that very list are active goes on by itself once none is
        (:func:`gpreempt.control.released_by_watch`). The mappings must outlive their use here.
        """
        if self._installed:
            self._impl.watch(list(addresses), version)

    def bind_thread(self, word_address: int, unbounded: bool = False) -> None:
        """Make the calling thread also wait while the u32 at ``word_address`` is nonzero.

        Used by the in-process scheduler: each task's threads follow their task's word.
        ``unbounded`` keeps the thread's launches out of the in-flight window (tasks that are
        never preempted in-process). ``word_address=0`` unbinds the thread.
        """
        self._impl.bind_thread(word_address, unbounded)

    def set_default_task_word(self, word_address: int) -> None:
        """The word that threads bound to no task follow (0: none). Autograd's worker threads
        are such threads, so the backward pass of a preempted training task waits too."""
        self._impl.set_default_task_word(word_address)

    # used by the torch patches
    def _before_launch(self) -> None:
        if self._installed:
            self._impl.before_launch()

    def _capture(self, begin: bool) -> None:
        if self._installed:
            if begin:
                self._impl.capture_begin()
            else:
                self._impl.capture_end()

    def __repr__(self) -> str:
        kind = "native" if self.native else "python"
        state = "installed" if self._installed else "uninstalled"
        return f"<Gate {kind} {state} bound={self.config.bound} auto={self.config.auto_activity}>"


_install_lock = threading.Lock()
_current: Gate | None = None


def current_gate() -> Gate | None:
    """The gate installed in this process, if any."""
    return _current


def install_gate(
    control: ControlBlock,
    *,
    bound: bool,
    auto_activity: bool,
    window_launches: int | None = None,
    window_ms: float | None = None,
    idle_grace_ms: float = 2.0,
    prefer_native: bool = True,
    record_every: int | None = None,
    open_window_ms: float | None = None,
    open_window_launches: int | None = None,
    tight_hold_ms: float | None = None,
    mode: str | None = None,
    op_costs: bool | None = None,
    barrier_ms: float | None = None,
) -> Gate:
    """Install the launch gate for this process and return it.

    ``bound``: bound this process's in-flight GPU work (tasks that may be preempted).
    ``auto_activity``: publish ``auto_active`` from this process's launches (tasks that preempt).
    ``window_launches`` / ``window_ms``: the tight window, in launches and in GPU time
    (defaults ``K*W`` = 128 and 1 ms; environment ``GPREEMPT_GATE_K``, ``GPREEMPT_GATE_W``,
    ``GPREEMPT_GATE_WINDOW_MS``). ``record_every``: K, launches per CUDA event while tight.
    ``open_window_ms`` (``GPREEMPT_GATE_OPEN_WINDOW_MS``, 25 ms): GPU time in flight while no
    more important task is around. ``tight_hold_ms`` (``GPREEMPT_GATE_HOLD_MS``, 1000): how long
    the window stays tight after the gate was last closed. ``mode``
    (``GPREEMPT_GATE_MODE``): ``adaptive`` (default), or ``tight``/``open`` always.
    ``prefer_native``: use the C++ hook, building it if needed (``GPREEMPT_GATE_NATIVE=0``
    forces the Python fallback). ``op_costs`` (``GPREEMPT_GATE_OP_COSTS``, on): the native gate
    times operators now and then and counts each at its own GPU time, not at the average.
    ``barrier_ms`` (``GPREEMPT_GATE_BARRIER_MS``, 0 = off here; :data:`RUN_BARRIER_MS` for
    tasks of mechanism ``gate``): every that much estimated GPU time, while the daemon gives
    the task an in-flight share (a more important task is registered on its GPU), the native
    gate of a bound task puts stream barriers on the current CUDA stream that hold its queued
    work on the GPU while a watched task is active or the daemon closed the gate; the CPU then
    keeps launching ahead instead of stopping. NVIDIA only (CUDA stream memory operations);
    ignored by the Python fallback.

    Raises UsageError for bad settings and RuntimeError if a gate is already installed.
    """
    global _current
    import torch  # the gate hooks PyTorch; callers install it once torch is imported

    config = resolve_config(
        bound=bound,
        auto_activity=auto_activity,
        record_every=record_every,
        window_launches=window_launches,
        window_ms=window_ms,
        open_window_ms=open_window_ms,
        open_window_launches=open_window_launches,
        tight_hold_ms=tight_hold_ms,
        mode=mode,
        idle_grace_ms=idle_grace_ms,
        op_costs=op_costs,
        barrier_ms=barrier_ms,
    )
    with _install_lock:
        if _current is not None and _current.installed:
            raise RuntimeError(
                "a launch gate is already installed in this process; uninstall() it first"
            )
        native_env = os.environ.get(ENV_NATIVE, "").strip().lower()
        use_native = prefer_native and native_env not in ("0", "false", "no", "off")
        impl: Any = None
        if use_native:
            from .gate_build import NativeGateUnavailable, load_native

            try:
                impl = _NativeImpl(load_native(), control, config)
            except NativeGateUnavailable as exc:
                print(
                    f"gpreempt: using the slow Python launch gate ({exc})",
                    file=sys.stderr,
                    flush=True,
                )
        native = impl is not None
        if impl is None:
            impl = _PythonImpl(control, config)
        gate = Gate(control, config, native, impl)
        gate._torch_patches.apply(torch)
        _current = gate
        return gate


def _cuda_initialized(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


class _TorchPatches:
    """Tells the gate what RecordFunction cannot see: CUDA init, graph capture and replay."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._undo: list[tuple[Any, str, Any]] = []

    def apply(self, torch: Any) -> None:
        gate = self._gate
        try:
            if torch.cuda.is_available():
                torch.cuda._lazy_call(lambda: gate._installed and gate._impl.set_device_live(True))
        except Exception:
            pass
        graph_cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
        if graph_cls is None:
            return
        for name in ("capture_begin", "capture_end", "replay"):
            original = graph_cls.__dict__.get(name)
            if original is None:
                continue
            self._undo.append((graph_cls, name, original))
            setattr(graph_cls, name, _wrap_graph_method(gate, name, original))

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def _wrap_graph_method(gate: Gate, name: str, original: Any) -> Any:
    if name == "capture_begin":

        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            gate._capture(True)
            try:
                return original(self, *args, **kwargs)
            except BaseException:
                gate._capture(False)
                raise

        return capture_begin
    if name == "capture_end":

        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(self, *args, **kwargs)
            finally:
                gate._capture(False)

        return capture_end

    def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        gate._before_launch()
        return original(self, *args, **kwargs)

    return replay


class _NativeImpl:
    """The C++ RecordFunction hook."""

    def __init__(self, module: Any, control: ControlBlock, config: GateConfig) -> None:
        import torch

        self._module = module
        module.install(
            control.address,
            control.doorbell,
            config.bound,
            config.auto_activity,
            config.record_every,
            config.open_record_every,
            config.window_launches,
            config.open_window_launches,
            config.window_ms,
            config.open_window_ms,
            config.tight_hold_ms,
            MODES.index(config.mode),
            config.idle_grace_ms,
            POLL_US,
            _cuda_initialized(torch),
            config.op_costs,
        )
        if config.barrier_ms > 0 and config.bound:
            control.keep_mapped()
            module.set_barriers(config.barrier_ms, hip=bool(getattr(torch.version, "hip", None)))

    def uninstall(self) -> None:
        self._module.uninstall()

    def stats(self) -> dict[str, Any]:
        return dict(self._module.stats())

    def drain(self) -> None:
        self._module.drain()

    def set_device_live(self, live: bool) -> None:
        self._module.set_device_live(live)

    def capture_begin(self) -> None:
        self._module.capture_begin()

    def capture_end(self) -> None:
        self._module.capture_end()

    def before_launch(self) -> None:
        self._module.before_launch()

    def bind_thread(self, word_address: int, unbounded: bool) -> None:
        self._module.bind_thread(word_address, unbounded)

    def watch(self, addresses: list[int], version: int) -> None:
        self._module.watch(addresses, version)

    def set_default_task_word(self, word_address: int) -> None:
        self._module.set_default_task_word(word_address)


class _Control:
    """Typed views of the control block's words, for the Python fallback."""

    def __init__(self, control: ControlBlock) -> None:
        base = control.address
        self.closed = ctypes.c_uint32.from_address(base + OFF_GATE_CLOSED)
        self.generation = ctypes.c_uint32.from_address(base + OFF_GENERATION)
        self.auto_active = ctypes.c_uint32.from_address(base + OFF_AUTO_ACTIVE)
        self.launches = ctypes.c_uint64.from_address(base + OFF_LAUNCHES)
        self.waits = ctypes.c_uint64.from_address(base + OFF_WAITS)
        self.wait_ns = ctypes.c_uint64.from_address(base + OFF_WAIT_NS)
        self.window = ctypes.c_uint32.from_address(base + OFF_WINDOW)
        self.installed = ctypes.c_uint32.from_address(base + OFF_GATE_INSTALLED)
        self.window_share_us = ctypes.c_uint32.from_address(base + OFF_WINDOW_SHARE_US)


class _PythonImpl:
    """The fallback: a TorchDispatchMode doing what the C++ hook does, ~1000x slower per op.

    Dispatch modes are per thread: it gates the installing thread and the autograd threads
    serving it, not other threads. Uninstall from the installing thread.
    """

    def __init__(self, control: ControlBlock, config: GateConfig) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        self._torch = torch
        self._control = control
        self._ctl = _Control(control)
        self._config = config
        self._thread_task = threading.local()
        self._default_task_word: Any = None
        self._watched: tuple[Any, ...] = ()  # u32 arrays over read-only control blocks
        self._watch_version = 0
        self._counter = itertools.count(1)
        self._launches = 0
        self._next_mark = config.record_every
        self._waits = 0
        self._wait_ns = 0
        self._bound_waits = 0
        self._bound_wait_ns = 0
        self._events_recorded = 0
        # (event, begin, mark, backlogged): see _retire_front
        self._fifo: deque[tuple[Any, int, int, bool]] = deque()
        self._done: tuple[Any, int] | None = None
        self._ns_per_launch = 0.0
        self._window = config.window_launches
        self._tight = config.mode == "tight"
        self._last_closed = -1e18
        self._seen_generation = self._ctl.generation.value
        self._device_live = _cuda_initialized(torch)
        self._captures = 0
        self._lock = threading.RLock()
        self._active = False
        self._activations = 0
        self._streams: list[Any] = []
        self._wake = threading.Event()
        self._stop = False
        self._pid = os.getpid()
        self._enabled = True
        self._installed = True
        self._ctl.window.value = config.window_launches
        gate = self

        class _GateMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                if gate._enabled:
                    gate.before_launch()
                return func(*args, **(kwargs or {}))

        self._mode = _GateMode()
        self._mode.__enter__()
        self._mode_thread = threading.get_ident()
        self._thread: threading.Thread | None = None
        if config.auto_activity:
            self._thread = threading.Thread(
                target=self._activity_loop, name="gpreempt-gate-activity", daemon=True
            )
            self._thread.start()
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        self._ctl.installed.value = 1

    # -- per operator --------------------------------------------------------------------
    def before_launch(self) -> None:
        n = next(self._counter)
        self._launches = n
        if self._must_wait(self._ctl.closed.value):
            self._wait_open(self._ctl.closed, watch=True, woken=True)
        task_word = getattr(self._thread_task, "word", None) or self._default_task_word
        if task_word is not None and task_word.value:
            self._wait_open(task_word)
        if getattr(self._thread_task, "unbounded", False):
            return
        if self._config.auto_activity and not self._active:
            self._mark_active()
            self._segment(n, force=True)
        elif n >= self._next_mark:
            self._segment(n, force=False)

    def bind_thread(self, word_address: int, unbounded: bool) -> None:
        if word_address:
            self._thread_task.word = ctypes.c_uint32.from_address(word_address)
            self._thread_task.unbounded = unbounded
        else:
            self._thread_task.word = None
            self._thread_task.unbounded = False

    def set_default_task_word(self, word_address: int) -> None:
        self._default_task_word = (
            ctypes.c_uint32.from_address(word_address) if word_address else None
        )

    def watch(self, addresses: list[int], version: int) -> None:
        words = ctypes.c_uint32 * (SIZE // 4)
        watched = tuple(words.from_address(a) for a in addresses if a)
        self._watched, self._watch_version = watched, version if watched else 0

    def _watched_active(self) -> bool:
        return any(words_want_gpu(words) for words in self._watched)

    def _closed_while_watched(self, closed: int) -> bool:
        """``closed`` holds the gate only while the watched tasks are active."""
        return released_by_watch(closed, self._watch_version, False)

    def _must_wait(self, closed: int) -> bool:
        """Whether the gate's own word ``closed`` (or the watched tasks) stop the launch."""
        if closed and not self._closed_while_watched(closed):
            return True
        return self._watched_active()

    def _wait_open(self, word: Any, watch: bool = False, woken: bool = False) -> None:
        """Wait while ``word`` is set or, with ``watch``, a watched task is active. ``woken``:
        whoever opens ``word`` wakes its waiters (the daemon's gate_closed), so a closed word
        is slept on for CLOSED_SLEEP_S at a time rather than polled."""
        if self._captures > 0 or self._capturing():
            return
        start = time.monotonic_ns()
        self._last_closed = start
        self._waits += 1
        self._ctl.waits.value = self._waits
        while self._installed and (self._must_wait(word.value) if watch else word.value):
            closed = word.value
            if woken and closed and not (watch and self._closed_while_watched(closed)):
                futex.wait(ctypes.addressof(word), closed, CLOSED_SLEEP_S)
            else:
                time.sleep(POLL_US / 1e6)
        end = time.monotonic_ns()
        self._last_closed = end
        self._wait_ns += end - start
        self._ctl.wait_ns.value = self._wait_ns

    def _capturing(self) -> bool:
        try:
            return bool(self._device_live and self._torch.cuda.is_current_stream_capturing())
        except Exception:
            return False

    def _is_tight(self, now: int) -> bool:
        if self._config.mode != "adaptive":
            return self._config.mode == "tight"
        if self._ctl.window_share_us.value:  # someone more important is registered
            return True
        return now - self._last_closed < self._config.tight_hold_ms * 1e6

    def _segment(self, n: int, force: bool) -> None:
        with self._lock:
            if not force and n < self._next_mark:
                return
            now = time.monotonic_ns()
            generation = self._ctl.generation.value
            if generation != self._seen_generation:
                self._seen_generation = generation
                self._last_closed = now
            self._tight = self._is_tight(now)
            cfg = self._config
            self._next_mark = n + (cfg.record_every if self._tight else cfg.open_record_every)
            self._ctl.launches.value = n
            if not self._device_live or self._captures > 0 or self._capturing():
                return
            cuda = self._torch.cuda
            stream = cuda.current_stream()
            if stream not in self._streams:
                self._streams = (self._streams + [stream])[-16:]
            if not cfg.bound:
                return
            begin = self._fifo[-1][2] if self._fifo else (self._done[1] if self._done else n)
            event = cuda.Event(enable_timing=True)
            event.record(stream)
            backlogged = bool(self._fifo) and not self._fifo[-1][0].query()
            self._fifo.append((event, begin, n, backlogged))
            self._events_recorded += 1
            self._reap()
            by_count = cfg.window_launches if self._tight else cfg.open_window_launches
            window_ms = cfg.window_ms if self._tight else cfg.open_window_ms
            share_us = self._ctl.window_share_us.value if self._tight else 0
            if share_us:  # the daemon's share of this GPU's in-flight budget
                share_ms = share_us / 1000
                window_ms = min(window_ms, share_ms) if window_ms > 0 else share_ms
            window = by_count
            if window_ms > 0 and self._ns_per_launch > 0:
                window = min(window, int(window_ms * 1e6 / self._ns_per_launch))
            if self._tight and window // 2 < cfg.record_every:
                self._next_mark = n + max(1, window // 2)
            self._window = window
            self._ctl.window.value = min(window, 0xFFFFFFFF)
            waited_from = 0
            while self._fifo and n - self._fifo[0][1] > window:
                waited_from = waited_from or time.monotonic_ns()
                self._fifo[0][0].synchronize()
                self._retire_front()
            if waited_from:
                self._bound_waits += 1
                self._bound_wait_ns += time.monotonic_ns() - waited_from

    def _retire_front(self) -> None:
        # Only a segment recorded while the previous event was still pending measures GPU
        # time: in any other the stream ran dry (the gate was closed, the CPU was slow) and the
        # time between the two events counts idle time too.
        event, _begin, mark, backlogged = self._fifo.popleft()
        if backlogged and self._done is not None and mark > self._done[1]:
            try:
                per = self._done[0].elapsed_time(event) * 1e6 / (mark - self._done[1])
            except RuntimeError:  # events on different streams or devices
                per = -1.0
            if per >= 0:
                self._ns_per_launch = (
                    per if self._ns_per_launch <= 0 else 0.8 * self._ns_per_launch + 0.2 * per
                )
        self._done = (event, mark)

    def _reap(self) -> None:
        while self._fifo and self._fifo[0][0].query():
            self._retire_front()

    # -- activity ------------------------------------------------------------------------
    def _publish(self) -> None:
        self._ctl.auto_active.value = 1 if self._active else 0
        self._control.ring()

    def _mark_active(self) -> None:
        with self._lock:
            if self._active:
                return
            self._active = True
            self._activations += 1
            self._publish()
        self._wake.set()

    def _gpu_done(self) -> bool:
        if not self._device_live or self._captures > 0 or not self._streams:
            return True
        with self._lock:
            events = []
            for stream in self._streams:
                event = self._torch.cuda.Event()
                event.record(stream)
                events.append(event)
        while not all(event.query() for event in events):
            time.sleep(50e-6)
        return True

    def _activity_loop(self) -> None:
        grace = self._config.idle_grace_ms / 1e3
        poll = max(50e-6, min(grace / 4, 500e-6))
        while not self._stop:
            if not self._active:
                self._wake.wait(0.2)
                self._wake.clear()
                continue
            seen = self._launches
            quiet_since: float | None = None
            while not self._stop:
                time.sleep(poll)
                if self._launches != seen:
                    seen = self._launches
                    quiet_since = None
                    continue
                self._gpu_done()
                if self._launches != seen:
                    continue
                now = time.monotonic()
                quiet_since = quiet_since or now
                if now - quiet_since < grace:
                    continue
                with self._lock:
                    if self._launches != seen:
                        continue
                    self._active = False
                    self._publish()
                break

    # -- control -------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        self._enabled = False
        self._installed = False
        self._thread = None

    def uninstall(self) -> None:
        if not self._installed and os.getpid() != self._pid:
            return
        self._installed = False
        self._enabled = False
        self._stop = True
        self._wake.set()
        if threading.get_ident() == self._mode_thread:
            # if another mode was pushed on top, ours stays, as a pass-through
            with contextlib.suppress(Exception):
                self._mode.__exit__(None, None, None)
        # from another thread the mode stays on the installing thread's stack, as a pass-through
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._active:
            self._active = False
            self._publish()
        self._ctl.installed.value = 0

    def stats(self) -> dict[str, Any]:
        return {
            "launches": self._launches,
            "waits": self._waits,
            "wait_seconds": self._wait_ns / 1e9,
            "bound_waits": self._bound_waits,
            "bound_wait_seconds": self._bound_wait_ns / 1e9,
            "events_recorded": self._events_recorded,
            "window": self._window,
            "tight": self._tight,
            "auto_active": self._active,
            "activations": self._activations,
            "device_live": self._device_live,
            "captures": self._captures,
            "events_in_flight": len(self._fifo),
            "streams": len(self._streams),
            "us_per_launch": self._ns_per_launch / 1e3,
            "error": None,
            "forked_child": os.getpid() != self._pid,
        }

    def drain(self) -> None:
        if self._device_live and self._captures == 0:
            with self._lock:
                for stream in self._streams:
                    stream.synchronize()
                self._reap()

    def set_device_live(self, live: bool) -> None:
        self._device_live = live

    def capture_begin(self) -> None:
        self._captures += 1

    def capture_end(self) -> None:
        self._captures = max(0, self._captures - 1)
