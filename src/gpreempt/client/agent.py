"""The in-process client that ``gpreempt run`` gives Python commands without code changes.

Once PyTorch is imported it opens the session and installs the launch gate, so the daemon
can stop this process's launches (gate mechanism) and learn when it uses the GPU
(automatic activity). Everything here is best-effort: a failure leaves the program running
as if it were not under gpreempt, with one line on stderr.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

from ..config import ENV_AUTO_ACTIVITY, ENV_GATE, ENV_TASK_ID, env_switch, idle_grace_ms
from ..priority import NAMED
from . import session

ENV_GATE_BOUND = "GPREEMPT_GATE_BOUND"


def _flag(name: str, default: bool) -> bool:
    return default if (value := env_switch(name)) is None else value


def install_gate_for(current: session.Session) -> Any:
    """Install the launch gate in this process for the session's task, if wanted and possible.

    Tasks below ``high`` priority bound their in-flight work (they may be preempted); every
    task detects its own GPU activity. ``GPREEMPT_GATE=0`` turns the gate off,
    ``GPREEMPT_GATE_BOUND`` and ``GPREEMPT_AUTO_ACTIVITY`` override the two halves. Tasks of
    mechanism ``auto`` (the default) and ``gate`` put stream barriers every 0.1 ms
    (``GPREEMPT_GATE_BARRIER_MS``, 0 = none).
    """
    if current.gate is not None or not _flag(ENV_GATE, True):
        return current.gate
    try:
        from .gate import ENV_BARRIER_MS, RUN_BARRIER_MS, install_gate, resolve_config
    except ImportError:
        return None
    if current.mechanism not in ("gate", "auto"):
        barrier_ms: float | None = 0.0
    elif os.environ.get(ENV_BARRIER_MS, "").strip():
        barrier_ms = None  # the environment's
    else:
        barrier_ms = RUN_BARRIER_MS
    bound = _flag(ENV_GATE_BOUND, current.priority < NAMED["high"])
    config = resolve_config(
        bound=bound,
        auto_activity=_flag(ENV_AUTO_ACTIVITY, True),
        idle_grace_ms=idle_grace_ms(bound),
        barrier_ms=barrier_ms,
    )
    gate = install_gate(current.control, config)
    current.use_gate(gate)
    return gate


def on_torch_imported(torch: ModuleType) -> None:
    current = session.current()
    if current is None:
        return
    try:
        install_gate_for(current)
    except Exception as exc:  # the program must run even if the gate cannot
        print(f"gpreempt: launch gate not installed: {exc}", file=sys.stderr)


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Runs :func:`on_torch_imported` right after ``import torch`` completes."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            on_torch_imported(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def boot() -> None:
    """Arm the client in a process started by ``gpreempt run``."""
    if not os.environ.get(ENV_TASK_ID):
        return
    if "torch" in sys.modules:
        on_torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchImportHook())
