"""Where the daemon lives on disk, and the environment variables that carry settings.

The runtime directory holds the socket, the lock, the event log and the daemon's
persisted state. It is private to its user (mode 0700).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import UsageError

ENV_RUNTIME_DIR = "GPREEMPT_RUNTIME_DIR"
#: Set by ``gpreempt run`` in the child's environment.
ENV_TASK_ID = "GPREEMPT_TASK_ID"
ENV_AUTO_ACTIVITY = "GPREEMPT_AUTO_ACTIVITY"
ENV_GRACE_MS = "GPREEMPT_IDLE_GRACE_MS"
ENV_GATE = "GPREEMPT_GATE"
ENV_LINGER_MS = "GPREEMPT_REQUEST_LINGER_MS"
ENV_REQUEST_WARM = "GPREEMPT_REQUEST_WARM"
#: ``1`` keeps XLA's command buffers in a task that may be preempted (client/framework_settings.py).
ENV_XLA_COMMAND_BUFFERS = "GPREEMPT_XLA_COMMAND_BUFFERS"

SOCKET_NAME = "gpreempt.sock"
LOCK_NAME = "daemon.lock"
EVENTS_NAME = "events.jsonl"
STATE_NAME = "suspended.json"
DAEMON_LOG_NAME = "daemon.log"

#: Grace of the tasks that preempt others (``high``): a fifth of a millisecond, enough to bridge
#: a server's turn from one queued request to the next, so that a trainer whose step is one long
#: launch (JAX) does not slip a whole step in between; it costs the eager trainer nothing
#: measurable (benchmarks/driver_gate/results/h200/grace: JAX beside torch, no ``request()``,
#: P99 2.1-4.0x of alone at 0 and 0.97-1.17x at 0.2 ms, kept 0.53-0.56 at both).
DEFAULT_IDLE_GRACE_MS = 0.2
#: Grace of the tasks that may be preempted: long enough that a training loop's gap between
#: steps (reading its loss) does not count as idle.
DEFAULT_BOUND_IDLE_GRACE_MS = 2.0
DEFAULT_REQUEST_LINGER_MS = 0.05


def default_runtime_dir() -> Path:
    """``$GPREEMPT_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/gpreempt``, else ``/tmp/gpreempt-UID``."""
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "gpreempt"
    return Path(f"/tmp/gpreempt-{os.getuid()}")


def resolve_runtime_dir(value: str | os.PathLike[str] | None) -> Path:
    """The runtime directory to use: the one given, else the default."""
    return Path(value) if value else default_runtime_dir()


def ensure_private_dir(path: Path, shared: bool = False) -> Path:
    """Create ``path`` with mode 0700 if needed, or check that the one there is a real
    directory of ours that other users cannot write (runtime_dir.py); never chmods one we did
    not create."""
    from .runtime_dir import prepare_runtime_dir

    return prepare_runtime_dir(path, shared)


def env_number(name: str, kind: type = float, minimum: float = 0, unit: str = "") -> Any:
    """The number in ``$name`` (``kind``: float or int), None if unset or blank; UsageError,
    naming the variable, if it is not a number of at least ``minimum`` (``unit``: what it
    counts, for the message)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    what = f"{'whole ' if kind is int else ''}number{f' of {unit}' if unit else ''}"
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(
            f"{name}={raw!r} is not a {what}; set it to a value >= {minimum} or unset it"
        ) from None
    if not value >= minimum:  # also refuses nan
        raise UsageError(f"{name}={raw!r} must be >= {minimum}")
    return value


def env_switch(name: str, environ: Mapping[str, str] | None = None) -> bool | None:
    """The switch in ``$name`` of ``environ`` (this process's environment unless given:
    1/true/yes/on or 0/false/no/off), None if unset or blank; UsageError, naming the
    variable, for anything else."""
    raw = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{name}={raw!r} is not a switch; set it to 1 or 0, or unset it")


def _env_ms(name: str, default: float) -> float:
    value = env_number(name, float, 0, "milliseconds")
    return default if value is None else value


def idle_grace_ms(bound: bool = False) -> float:
    """Grace after GPU work completes before a task counts as idle (``$GPREEMPT_IDLE_GRACE_MS``;
    by default short for tasks that preempt others, longer for ``bound`` ones)."""
    default = DEFAULT_BOUND_IDLE_GRACE_MS if bound else DEFAULT_IDLE_GRACE_MS
    return _env_ms(ENV_GRACE_MS, default)


def request_linger_ms() -> float:
    """How long a process's requests stay raised after the last one ends, so that a request
    started right after it finds less important tasks still stopped
    (``$GPREEMPT_REQUEST_LINGER_MS``; 0 drops them at once)."""
    return _env_ms(ENV_LINGER_MS, DEFAULT_REQUEST_LINGER_MS)


def request_warm() -> bool:
    """Whether entering a request puts a no-op kernel on the current CUDA stream, so that the
    GPU switches to this process while the request prepares instead of at its first kernel
    (``$GPREEMPT_REQUEST_WARM``, off by default)."""
    return env_switch(ENV_REQUEST_WARM) or False
