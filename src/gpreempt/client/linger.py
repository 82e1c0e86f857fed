"""Keeping a process's requests raised for a moment after the last one ends.

A server with a queue ends one request and starts the next a few microseconds later. If the
``requests`` word dropped to 0 in between, less important tasks would be let run in that gap:
a gate with stream barriers (``docs/gate.md``) releases the trainer's queued work on the GPU
at once, and the server's next request then waits for that work. Holding the word for a short
*linger* after the last request ends closes the gap: a request that starts within it finds
the word still raised, and nobody, neither the daemon nor a watching gate, sees the process
go idle.

The word drops from a helper thread once the linger has passed with no new request. That
thread sets its own timer slack to 1 us where Linux allows, so the drop comes close to the
deadline instead of 50 us (the default slack) late. It needs the interpreter lock to drop
the word, so while another thread of the process runs Python code without pause, the drop can
come up to the interpreter's switch interval (5 ms) late: less important tasks then wait that
much longer, and the process's own requests are never delayed.

:class:`PythonScopes` counts a process's open ``request()`` scopes with it, where the native
counter (:mod:`.native_scopes`), which wakes no thread at a request's end, cannot be built.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..control_block import ControlBlock

#: ``prctl(PR_SET_TIMERSLACK, ns)``: how late the kernel may wake this thread's timed waits.
_PR_SET_TIMERSLACK = 29
_SLACK_NS = 1000


def _tighten_timer_slack() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(_SLACK_NS), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the default slack only makes the drop a little later


class Linger:
    """Defers "the last request ended" by ``seconds``, unless a new request starts first.

    ``lock`` is the caller's lock around its request count: :meth:`arm` and :meth:`cancel`
    are called with it held, and ``release`` is called with it held, so a request that starts
    while the word is being dropped is seen either before (the drop is skipped) or after (it
    raises the word again).
    """

    def __init__(self, seconds: float, release: Callable[[], None], lock: threading.Lock) -> None:
        if seconds < 0:
            raise ValueError(f"a linger cannot be negative, got {seconds} s")
        self.seconds = seconds
        self._release = release
        self._cond = threading.Condition(lock)
        self._deadline: float | None = None  # when the word drops; None = nothing pending
        self._thread: threading.Thread | None = None
        self.releases = 0  # drops done after a linger, for tests and statistics
        self.bridged = 0  # requests that started while the word still lingered

    def arm(self) -> None:
        """The last request ended: drop the word after the linger (caller holds the lock)."""
        self._deadline = time.monotonic() + self.seconds
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpreempt-linger", daemon=True)
            self._thread.start()
        self._cond.notify()

    def cancel(self) -> bool:
        """A request starts: True if the word is still raised from the last one, which then
        needs no new write (caller holds the lock)."""
        if self._deadline is None:
            return False
        self._deadline = None
        self.bridged += 1
        return True

    def _run(self) -> None:
        _tighten_timer_slack()
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline = None
                self.releases += 1
                try:
                    self._release()
                except (ValueError, OSError):
                    return  # the block was closed (the process is shutting down)


class PythonScopes:
    """The open request scopes of one control block, counted in Python, and their linger: the
    interface of :class:`.native_scopes.NativeScopes`, for a process that cannot build it."""

    def __init__(self, control: ControlBlock, seconds: float) -> None:
        self._control = control
        self._lock = threading.Lock()
        self._open = 0
        self.linger = Linger(seconds, lambda: control.set_requests(0), self._lock)

    def enter(self, hint: bool) -> bool:
        """A scope opens; True if it raised the ``requests`` word (nothing held it raised)."""
        with self._lock:
            self._open += 1
            raised = self._open == 1 and not self.linger.cancel()
            if raised or (hint and not self._control.hinted):
                self._control.set_requests(1, hint)
        return raised

    def exit(self) -> None:
        """A scope closes; the last one lets the word drop after the linger."""
        with self._lock:
            self._open -= 1
            if self._open > 0:
                return
            if self.linger.seconds > 0:
                self.linger.arm()
            else:
                self._control.set_requests(0)

    open = property(lambda self: self._open, doc="Scopes open now.")
    releases = property(lambda self: self.linger.releases, doc="Drops after a linger.")
    bridged = property(
        lambda self: self.linger.bridged, doc="Requests that opened while the word still lingered."
    )
