"""The driver-level gate, seen from Python: loading it for a command, handing it the control
block, and giving CUPTI to a profiler for as long as it profiles.

``gpreempt run`` builds the library (:mod:`.driver_build`) and names it in the command's
``CUDA_INJECTION64_PATH``; the CUDA driver then loads it into every process of the command at
``cuInit``, and it sees every launch through CUPTI's callbacks (``csrc/driver_gate.h`` says what
it does with them). A Python process under ``gpreempt run`` hands its own control block to it
(:func:`adopt`) when its session opens, before CUDA starts, so one block carries the operator
gate's words and the driver gate's; a process without the Python client opens a channel of its
own from C++.

Where the variable is already set (Nsight Systems, another tool) the command keeps it, runs
without the driver-level gate, and ``gpreempt run`` says so in one line; ``GPREEMPT_DRIVER_GATE=0``
turns it off. The daemon backs a task whose gate does not hold everything with the driver lock.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...config import DEFAULT_BOUND_IDLE_GRACE_MS, env_number, idle_grace_ms
from .config import ENV_BARRIER_MS, ENV_OPEN_WINDOW_MS, RUN_BARRIER_MS

#: The variable the CUDA driver reads at cuInit.
ENV_INJECTION = "CUDA_INJECTION64_PATH"
#: The library ``gpreempt run`` loads, as the command's processes see it; ``0`` = off.
ENV_DRIVER_GATE = "GPREEMPT_DRIVER_GATE"

#: The control block's ``driver_gate`` word (``csrc/control_layout.h``).
STATES = {0: "none", 1: "on", 2: "unavailable", 3: "released", 4: "failed"}
STATE_ON = 1

#: GPU time between two stream barriers, and in flight at most on a stream (the operator
#: gate's ``RUN_BARRIER_MS`` and ``DEFAULT_OPEN_WINDOW_MS``).
BARRIER_US = RUN_BARRIER_MS * 1000.0
WINDOW_MS = 25.0


@dataclass(frozen=True)
class DriverConfig:
    """What the driver-level gate of a task's processes does."""

    bound: bool  # may be preempted: barriers and a bounded queue
    auto_activity: bool  # publishes its launches as activity (tasks that preempt others)
    barrier_us: float = BARRIER_US
    window_ms: float = WINDOW_MS
    idle_grace_ms: float = DEFAULT_BOUND_IDLE_GRACE_MS

    def environment(self) -> dict[str, str]:
        """The variables the C++ side reads where it opens its own channel."""
        return {
            "GPREEMPT_DRIVER_BOUND": "1" if self.bound else "0",
            "GPREEMPT_DRIVER_ACTIVITY": "1" if self.auto_activity else "0",
            "GPREEMPT_DRIVER_BARRIER_US": f"{self.barrier_us:g}",
            "GPREEMPT_DRIVER_WINDOW_MS": f"{self.window_ms:g}",
            "GPREEMPT_DRIVER_GRACE_MS": f"{self.idle_grace_ms:g}",
        }


def driver_config_for(priority: int, closes_gate: bool) -> DriverConfig:
    """The settings for a task of this priority whose mechanism does (or not) stop it by its
    gate: tasks below ``high`` hold a bounded queue behind barriers; every task tells its
    activity from its launches. ``GPREEMPT_GATE_BARRIER_MS`` spaces the barriers as it does the
    operator gate's (0: none), and ``GPREEMPT_GATE_OPEN_WINDOW_MS`` bounds the work in flight
    per stream as it does the operator gate's open window; UsageError, naming the variable,
    for a value that is no number >= 0."""
    from ...priority import NAMED

    bound = closes_gate and priority < NAMED["high"]
    barrier_ms = env_number(ENV_BARRIER_MS, float, 0, "ms")
    window_ms = env_number(ENV_OPEN_WINDOW_MS, float, 0, "ms")
    return DriverConfig(
        bound=bound,
        auto_activity=True,
        barrier_us=BARRIER_US if barrier_ms is None else barrier_ms * 1000.0,
        window_ms=WINDOW_MS if window_ms is None else window_ms,
        idle_grace_ms=idle_grace_ms(bound),
    )


def command_environment(
    env: Mapping[str, str], priority: int, closes_gate: bool
) -> tuple[dict[str, str], str | None]:
    """The variables that load the driver-level gate into a command, and a line to say where it
    cannot be (None where it is loaded, or where nothing on this machine runs CUDA)."""
    if env.get(ENV_DRIVER_GATE, "").strip().lower() in ("0", "false", "no", "off"):
        return {}, None
    if env.get(ENV_INJECTION):
        return {}, (
            f"{ENV_INJECTION} is already set ({env[ENV_INJECTION]}): no driver-level gate for "
            "this command; its PyTorch operators are gated, the driver lock holds the rest"
        )
    from .driver_build import DriverGateUnavailable, build

    try:
        path = build()
    except DriverGateUnavailable as exc:
        return {}, (f"driver-level gate unavailable: {exc}" if _has_nvidia_gpu() else None)
    extra = {ENV_INJECTION: str(path), ENV_DRIVER_GATE: str(path)}
    extra.update(driver_config_for(priority, closes_gate).environment())
    return extra, None


def _has_nvidia_gpu() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")


_lock = threading.Lock()
_library: Any = None


def library() -> Any:
    """The driver-level gate of this process (loaded by path, the same copy the driver loads
    at cuInit), or None where ``gpreempt run`` gave it none."""
    global _library
    path = os.environ.get(ENV_DRIVER_GATE, "")
    if not path or path == "0" or os.environ.get(ENV_INJECTION) != path:
        return None
    with _lock:
        if _library is None:
            lib = ctypes.CDLL(path)
            lib.gpreempt_driver_adopt.argtypes = [
                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                ctypes.c_double, ctypes.c_double, ctypes.c_double,
            ]  # fmt: skip
            lib.gpreempt_driver_set_watch.argtypes = [
                ctypes.POINTER(ctypes.c_size_t),
                ctypes.c_size_t,
                ctypes.c_uint32,
            ]
            for name in ("release", "resume", "state"):
                getattr(lib, f"gpreempt_driver_{name}").restype = ctypes.c_uint32
            _library = lib
        return _library


def adopt(memfd: int, doorbell: int, config: DriverConfig, *, torch_gate: bool) -> bool:
    """Hand the process's control block (its memfd, which the gate maps for itself, and its
    doorbell) to the driver-level gate; False where there is none or it already opened a
    channel of its own."""
    lib = library()
    if lib is None:
        return False
    taken = lib.gpreempt_driver_adopt(
        memfd,
        doorbell,
        int(config.bound),
        int(config.auto_activity),
        int(torch_gate),
        config.barrier_us,
        config.window_ms,
        config.idle_grace_ms,
    )
    return bool(taken)


def set_watch(addresses: Sequence[int], version: int) -> None:
    """The watched tasks' control blocks, as the session mapped them."""
    lib = library()
    if lib is None:
        return
    array = (ctypes.c_size_t * max(1, len(addresses)))(*addresses)
    lib.gpreempt_driver_set_watch(array, len(addresses), version)


def take_activity() -> bool:
    """Have the driver-level gate publish the process's activity from its launches, which
    PyTorch's operator gate handed over; False where there is no gate, it holds no block, or
    the task detects no activity."""
    lib = library()
    take = getattr(lib, "gpreempt_driver_take_activity", None)
    return take is not None and bool(take())


def state() -> str:
    """``on``, ``released`` (a profiler holds CUPTI), ``unavailable``, ``failed`` or ``none``."""
    lib = library()
    return "none" if lib is None else STATES.get(lib.gpreempt_driver_state(), "none")


class ProfilerHandover:
    """Gives CUPTI to a profiler started in this process, and takes it back after.

    CUPTI has one callback subscriber per process. PyTorch's profiler (Kineto) subscribes when
    it starts a trace; while the driver-level gate holds the subscriber it would record
    nothing. Around a trace the gate lets go (its state reads ``released``, and the daemon backs
    the task with the driver lock meanwhile) and subscribes again once the trace ends.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def apply(self, torch: Any) -> None:
        autograd_profiler = getattr(getattr(torch, "autograd", None), "profiler", None)
        profile = getattr(autograd_profiler, "profile", None)
        if profile is None or library() is None:
            return
        for name, before in (("_prepare_trace", True), ("_start_trace", True),
                             ("__enter__", True), ("__exit__", False)):  # fmt: skip
            original = profile.__dict__.get(name)
            if original is None:
                continue
            self._undo.append((profile, name, original))
            setattr(profile, name, _around(original, before))

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def _around(original: Any, before: bool) -> Any:
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        lib = library()
        if before and lib is not None:
            lib.gpreempt_driver_release()
        try:
            return original(self, *args, **kwargs)
        finally:
            if not before and lib is not None and lib.gpreempt_driver_resume() != STATE_ON:
                print(
                    "gpreempt: the profiler kept CUPTI: this process's GPU work is held by "
                    "the driver lock from now on",
                    file=sys.stderr,
                )

    return wrapped
