"""What every request marker shares: whether this process marks requests, and one mark."""

from __future__ import annotations

import sys
import threading

from ...config import env_switch
from ...errors import UsageError
from ...priority import NAMED
from .. import session

#: ``0`` turns the automatic request markers off (for servers that mark requests by hand, or
#: to compare).
ENV_AUTO_REQUESTS = "GPREEMPT_AUTO_REQUESTS"
#: The launch gate's bound switch (:mod:`..agent`): a bound task may be preempted.
ENV_GATE_BOUND = "GPREEMPT_GATE_BOUND"
_warned = False


def enabled() -> bool:
    """Whether requests may be marked automatically (``GPREEMPT_AUTO_REQUESTS`` is not 0).
    A value that is no switch says so in one line and counts as 0."""
    global _warned
    try:
        return env_switch(ENV_AUTO_REQUESTS) is not False
    except UsageError as exc:
        if not _warned:
            _warned = True
            print(f"gpreempt: {exc}; requests are not marked", file=sys.stderr)
        return False


def preempts_others(priority: int) -> bool:
    """Whether a task of ``priority`` preempts others: its launch gate is unbounded, by the
    rule of :func:`..agent.gate_config_for` (below ``high`` bound, ``GPREEMPT_GATE_BOUND``
    overriding)."""
    try:
        bound = env_switch(ENV_GATE_BOUND)
    except UsageError:
        bound = None  # the gate says so when it is installed
    return not (priority < NAMED["high"] if bound is None else bound)


def marking_session(marker: str) -> session.Session | None:
    """The process's session, if the requests of its server (run by ``marker``'s framework,
    a name of :data:`gpreempt.control.MARKERS`) are to be marked: under gpreempt, not opted
    out, in a task that preempts others. Its control block then names ``marker``."""
    if not enabled():
        return None
    current = session.current()
    if current is None or not preempts_others(current.priority):
        return None
    current.control.set_marker(marker)
    return current


class Mark:
    """One request's mark in a session: opened when made, closed by the first :meth:`close`
    (a request may end in several ways at once: its handler returns, its stream ends, its
    RPC is cancelled)."""

    __slots__ = ("_session", "_open", "_lock")

    def __init__(self, current: session.Session, whole: bool = True) -> None:
        """``whole``: the mark covers a whole request (an HTTP request, an RPC), so the
        process's marks alone say when it is active from now on; else (a ``generate`` call,
        with copies of its own before and after it) the mark adds to its launches."""
        self._session = current
        self._lock = threading.Lock()
        current.enter_request(hint=whole)
        self._open = True

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        self._session.exit_request()
