"""The Python counterparts of ``gpreempt attach|suspend|resume|evict|restore|status``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..messages import TaskFields
from ..names import MechanismName
from . import session
from .connection import DaemonClient


def attach(
    priority: str | int = "normal",
    *,
    name: str | None = None,
    gpus: Sequence[int] = (0,),
    mechanism: str = MechanismName.AUTO,
    always_active: bool = False,
    runtime_dir: str | os.PathLike[str] | None = None,
    gate: bool = True,
) -> session.Session:
    """Register this process with the daemon and, if PyTorch is loaded, install its gate.

    For code that opts in without ``gpreempt run``. The task ends when the process exits.
    """
    fields = TaskFields(  # checked here, before anything is opened
        name=name,
        priority=priority,
        gpus=tuple(gpus),
        mechanism=mechanism,
        always_active=always_active,
    )
    register = fields.to_wire()
    current = session.open_session(None if runtime_dir is None else str(runtime_dir), register)
    if gate:
        import sys

        if "torch" in sys.modules:
            from .agent import install_gate_for

            install_gate_for(current)
    return current


def _control(verb: str, target: str | int, runtime_dir: Any) -> dict[str, Any]:
    with DaemonClient.connect(runtime_dir) as client:
        if verb == "hold":
            return client.hold(target, True)["task"]
        if verb == "release":
            return client.hold(target, False)["task"]
        if verb == "evict":
            return client.evict(target)["task"]
        return client.restore(target)["task"]


def suspend(target: str | int, runtime_dir: str | os.PathLike[str] | None = None) -> dict:
    """Hold a task (name or pid) suspended until :func:`resume`, whatever the policy says."""
    return _control("hold", target, runtime_dir)


def resume(target: str | int, runtime_dir: str | os.PathLike[str] | None = None) -> dict:
    """Release a task held by :func:`suspend`; the policy decides again."""
    return _control("release", target, runtime_dir)


def evict(target: str | int, runtime_dir: str | os.PathLike[str] | None = None) -> dict:
    """Move a task's GPU memory to the host (NVIDIA driver checkpoint)."""
    return _control("evict", target, runtime_dir)


def restore(target: str | int, runtime_dir: str | os.PathLike[str] | None = None) -> dict:
    """Bring an evicted task's GPU memory back."""
    return _control("restore", target, runtime_dir)


def status(runtime_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The daemon's view of every task (the same as ``gpreempt status --json``)."""
    with DaemonClient.connect(runtime_dir) as client:
        reply = client.status()
    reply.pop("ok", None)
    return reply
