"""The exceptions gpreempt raises: one base class, a few named kinds.

Every message says what was wrong and what to do about it, because these reach users
through the CLI unchanged.
"""

from __future__ import annotations


class GpreemptError(Exception):
    """Base class of every error gpreempt raises on purpose."""


class UsageError(GpreemptError, ValueError):
    """A bad argument or value from the user (CLI exit code 2)."""


class PriorityError(UsageError):
    """A priority that is neither a class name nor an integer in range."""


class ProtocolError(GpreemptError):
    """A message on the daemon socket that is malformed, oversized or cut short."""


class DaemonUnavailable(GpreemptError):
    """No daemon answers on the runtime directory's socket."""


class DaemonNotStartable(DaemonUnavailable):
    """No daemon answers, and none can be started here: the runtime directory is read-only
    (a node daemon's, mounted read-only into a container)."""


class DaemonAlreadyRunning(GpreemptError):
    """Another daemon already serves this runtime directory."""


class PermissionDenied(GpreemptError):
    """The caller may not act on that process (it belongs to another user)."""


class NoSuchTask(GpreemptError):
    """No registered task matches the name or pid given."""


class NoSuchProcess(UsageError):
    """The pid does not exist (or exited)."""


class MechanismUnavailable(GpreemptError):
    """The requested preemption mechanism cannot work for this process or machine."""


class MechanismFailed(GpreemptError):
    """A mechanism was available but its call failed (the message carries the driver's reason)."""


class RemoteError(GpreemptError):
    """The daemon refused a request; ``kind`` names the error class it raised."""

    def __init__(self, message: str, kind: str = "GpreemptError") -> None:
        super().__init__(message)
        self.kind = kind


#: Errors a daemon reply can name, so the client re-raises the same class.
BY_NAME: dict[str, type[GpreemptError]] = {
    cls.__name__: cls
    for cls in (
        GpreemptError,
        UsageError,
        PriorityError,
        ProtocolError,
        PermissionDenied,
        NoSuchTask,
        NoSuchProcess,
        MechanismUnavailable,
        MechanismFailed,
    )
}
