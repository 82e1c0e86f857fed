"""The in-process client that ``gpreempt run`` gives Python commands without code changes.

Once PyTorch or CuPy is imported it opens the session and hands its control block to the
driver-level gate that ``gpreempt run`` loads for CUDA (:mod:`.gate.driver`), which holds
every launch of the process; with PyTorch it also installs the operator gate, so the daemon
can stop this process's launches (gate mechanism) and learn when it uses the GPU (automatic
activity; where another framework runs beside PyTorch, JAX or CuPy say, the driver-level gate
tells that). Without the driver-level gate, a process that imports CuPy and not PyTorch gets
stream barriers instead (:mod:`.stream_barriers`), if it may be preempted. A server
framework's import (uvicorn, hypercorn, Starlette, FastAPI, grpcio) arms its request marker
(:mod:`.markers`), which marks each request of a task that preempts others as
``gpreempt.request()`` does. Everything here is best-effort: a failure leaves the program
running as if it were not under gpreempt, with one line on stderr.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..config import ENV_AUTO_ACTIVITY, ENV_GATE, ENV_TASK_ID, env_switch, idle_grace_ms
from ..priority import NAMED
from . import markers, session

if TYPE_CHECKING:
    from .gate import GateConfig

ENV_GATE_BOUND = "GPREEMPT_GATE_BOUND"

#: Frameworks whose GPU launches PyTorch's operator gate never sees. Beside PyTorch, in a task
#: that tells others when it is active, the driver-level gate tells it (hand_activity_over).
OTHER_FRAMEWORKS = ("cupy", "jax", "tensorflow", "tensorrt", "pycuda")


def _flag(name: str, default: bool) -> bool:
    return default if (value := env_switch(name)) is None else value


def _closes_gate(mechanism: str) -> bool:
    """Whether the daemon stops a task of this mechanism by closing its gate (``auto``,
    ``gate``), so stream barriers hold its queue. Imported here, not at start-up: a command
    that never imports PyTorch or CuPy does not pay for the mechanisms."""
    from ..mechanisms import kind

    return kind(mechanism).closes_gate


def gate_config_for(priority: int, mechanism: str) -> GateConfig:
    """The launch gate's settings for a task of this priority and mechanism, as ``gpreempt
    run`` gives them: the same for the benchmarks that measure them.

    Tasks below ``high`` priority bound their in-flight work (they may be preempted); every
    task detects its own GPU activity. ``GPREEMPT_GATE_BOUND`` and ``GPREEMPT_AUTO_ACTIVITY``
    override the two halves. Tasks of mechanism ``auto`` (the default) and ``gate`` put stream
    barriers every 0.2 ms (``GPREEMPT_GATE_BARRIER_MS``, 0 = none); others none. Raises
    ImportError where the gate cannot be had (no PyTorch).
    """
    from .gate import ENV_BARRIER_MS, RUN_BARRIER_MS, resolve_config

    if not _closes_gate(mechanism):
        barrier_ms: float | None = 0.0
    elif os.environ.get(ENV_BARRIER_MS, "").strip():
        barrier_ms = None  # the environment's
    else:
        barrier_ms = RUN_BARRIER_MS
    bound = _flag(ENV_GATE_BOUND, priority < NAMED["high"])
    return resolve_config(
        bound=bound,
        auto_activity=_flag(ENV_AUTO_ACTIVITY, True),
        idle_grace_ms=idle_grace_ms(bound),
        barrier_ms=barrier_ms,
    )


def adopt_driver_gate(current: session.Session, *, torch_gate: bool) -> bool:
    """Hand the session's control block to the driver-level gate that ``gpreempt run`` loads
    for CUDA (:mod:`.gate.driver`), before CUDA starts; False where there is none, or it
    already opened a channel of its own (CUDA started first)."""
    if current.driver_gate and not torch_gate:
        return True
    from .gate import driver

    if driver.library() is None:
        return False
    config = driver.driver_config_for(current.priority, _closes_gate(current.mechanism))
    control = current.control
    if not driver.adopt(control.memfd, control.doorbell, config, torch_gate=torch_gate):
        return False
    current.use_driver_gate()
    return True


def install_gate_for(current: session.Session) -> Any:
    """Install the launch gate in this process for the session's task
    (:func:`gate_config_for`), unless ``GPREEMPT_GATE=0`` or the gate cannot be had. The
    driver-level gate, where ``gpreempt run`` loads one, takes the same control block (with
    ``GPREEMPT_GATE=0`` too) and holds what the operator hook does not see (Triton, CuPy,
    JAX, extensions)."""
    if current.gate is not None:
        return current.gate
    operator_gate = _flag(ENV_GATE, True)
    # without the operator gate the driver-level gate still takes the session's block (as in a
    # process without PyTorch): it would otherwise register the process a second time, over a
    # channel of its own
    if adopt_driver_gate(current, torch_gate=operator_gate):
        import torch

        from .gate.driver import ProfilerHandover

        ProfilerHandover().apply(torch)
    if not operator_gate:
        return None
    try:
        from .gate import install_gate

        config = gate_config_for(current.priority, current.mechanism)
    except ImportError:
        return None
    gate = install_gate(current.control, config)
    current.use_gate(gate)
    if any(name in sys.modules for name in OTHER_FRAMEWORKS):
        hand_activity_over(current)
    return gate


def hand_activity_over(current: session.Session) -> bool:
    """Have the driver-level gate tell the task's activity instead of PyTorch's operator gate,
    in a task that tells others when it is active (nothing preempts it) and runs another
    framework beside PyTorch (:data:`OTHER_FRAMEWORKS`): the operator gate sees only PyTorch's
    operators, so that framework's work (a JAX or CuPy request) would never raise the task's
    activity. The driver-level gate sees every launch, at the price of keeping CUPTI's
    subscriber (gate.md). True if it took activity over."""
    gate = current.gate
    if gate is None or not current.driver_gate or gate.config.bound:
        return False
    from .gate import driver

    if not gate.config.auto_activity or driver.state() != "on" or not gate.hand_activity(True):
        return False
    if driver.take_activity():
        return True
    gate.hand_activity(False)  # the operator gate's own activity again: better than none
    return False


def _arm(install: Callable[[session.Session], Any], failure: str) -> None:
    """Run ``install`` on the process's session, if it has one; a failure costs one line on
    stderr (``failure``: what did not happen), never the program."""
    current = session.current()
    if current is None:
        return
    try:
        install(current)
    except Exception as exc:  # the program must run even if this cannot
        print(f"gpreempt: {failure}: {exc}", file=sys.stderr)


def on_torch_imported(torch: ModuleType) -> None:
    _arm(install_gate_for, "launch gate not installed")


def start_barriers_for(current: session.Session) -> Any:
    """Start stream barriers (:mod:`.stream_barriers`) for a process without a launch gate,
    if it may be preempted, its mechanism closes gates (``auto``, ``gate``) and
    ``GPREEMPT_GATE`` is not 0; returns them, or None. The driver-level gate, where
    ``gpreempt run`` loads one, takes the session's control block instead, whatever
    ``GPREEMPT_GATE`` says."""
    if current.gate is not None or current.barriers is not None:
        return current.barriers
    if adopt_driver_gate(current, torch_gate=False):
        return None  # the driver-level gate holds every launch, barriers included
    if not _flag(ENV_GATE, True) or not _closes_gate(current.mechanism):
        return None
    if current.priority >= NAMED["high"]:
        return None  # nothing preempts it: nothing to hold
    from .stream_barriers import StreamBarriers

    barriers = StreamBarriers.start_for(current.control)
    if barriers is not None:
        current.use_barriers(barriers)
    return barriers


def on_cupy_imported(cupy: ModuleType) -> None:
    if "torch" in sys.modules:  # the driver-level gate, adopted with PyTorch's, holds them
        on_other_framework_imported(cupy)
        return
    _arm(start_barriers_for, "stream barriers not started")


def on_other_framework_imported(module: ModuleType) -> None:
    """A framework whose launches PyTorch's operator gate never sees: where PyTorch runs too,
    the driver-level gate tells the task's activity (:func:`hand_activity_over`)."""
    if "torch" in sys.modules:
        _arm(hand_activity_over, "activity not handed to the driver-level gate")


def on_server_imported(module: ModuleType) -> None:
    """A server framework's module (:data:`.markers.SERVER_HOOKS`) is imported: arm its
    request marker, which decides when the server starts whether this process marks."""
    try:
        markers.arm(module)
    except Exception as exc:  # the server must run even if this cannot
        print(f"gpreempt: requests of {module.__name__} not marked: {exc}", file=sys.stderr)


#: What to do once each of these modules is imported.
ON_IMPORT = {
    "torch": on_torch_imported,
    "cupy": on_cupy_imported,
    **{name: on_other_framework_imported for name in OTHER_FRAMEWORKS if name != "cupy"},
    **dict.fromkeys(markers.SERVER_HOOKS, on_server_imported),
}


class _ImportHook(importlib.abc.MetaPathFinder):
    """Runs the :data:`ON_IMPORT` action of a module right after its import completes."""

    def __init__(self, pending: dict[str, Any]) -> None:
        self._pending = dict(pending)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        action = self._pending.pop(fullname, None)
        if action is None:
            return None
        if not self._pending:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            action(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def boot() -> None:
    """Arm the client in a process started by ``gpreempt run``."""
    if not os.environ.get(ENV_TASK_ID):
        return
    pending = {}
    for name, action in ON_IMPORT.items():
        if name in sys.modules:
            action(sys.modules[name])
        else:
            pending[name] = action
    if pending:
        sys.meta_path.insert(0, _ImportHook(pending))
