"""Counting a process's open ``request()`` scopes in native code (``csrc/request_scopes.cpp``).

A request that ends with the Python linger (:mod:`.linger`) wakes its helper thread, which then
needs the interpreter lock while the server prepares its next request: that costs the server
12-23 us of CPU at each end (``docs/servers.md``, "What a mark costs"). The native counter's
helper never takes the lock; it sleeps through most of a request and polls near its end, so
ending a request writes a deadline and wakes nobody. The first request of a busy period raises
the word and rings the daemon, unless the daemon said that every task this process outranks
holds itself on that word (the block's ``quiet``): then the helper rings it at its next poll,
at most 0.25 ms later, and the request pays for no wake-up at all.

It is built once per user (:mod:`.gate.scopes_build`, which this module imports only when it
first loads the library, so that ``python -m`` runs that module cleanly); a process that cannot
build or load it keeps the Python linger (:func:`open_scopes` gives None).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..control_block import ControlBlock
from .gate.build import NativeGateUnavailable

_lock = threading.Lock()
_library: Any = None


def _load() -> Any:
    global _library
    if _library is not None:  # (a forked child may find the lock held by a thread it lost)
        return _library
    with _lock:
        if _library is None:
            from .gate.scopes_build import build

            try:
                lib = ctypes.PyDLL(str(build()))  # calls keep the interpreter lock: short ones
            except OSError as exc:
                raise NativeGateUnavailable(f"cannot load the request counter: {exc}") from None
            lib.gpreempt_scopes_open.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_double]
            lib.gpreempt_scopes_open.restype = ctypes.c_void_p
            lib.gpreempt_scopes_enter.argtypes = [ctypes.c_void_p, ctypes.c_int]
            lib.gpreempt_scopes_enter.restype = ctypes.c_int
            lib.gpreempt_scopes_exit.argtypes = [ctypes.c_void_p]
            lib.gpreempt_scopes_exit.restype = None
            lib.gpreempt_scopes_stat.argtypes = [ctypes.c_void_p, ctypes.c_int]
            lib.gpreempt_scopes_stat.restype = ctypes.c_uint64
            _library = lib
        return _library


def _statistic(index: int, doc: str) -> property:
    """A read-only count of the native counter, by its index in ``gpreempt_scopes_stat``."""
    return property(lambda self: int(self._stat(self._handle, index)), doc=doc)


class NativeScopes:
    """The open request scopes of one control block, and their linger.

    ``address`` is the block's mapping, which must stay mapped for the process's life (the
    helper thread writes it); ``doorbell`` its eventfd.
    """

    def __init__(self, address: int, doorbell: int, linger_s: float) -> None:
        if linger_s < 0:
            raise ValueError(f"a linger cannot be negative, got {linger_s} s")
        lib = _load()
        self._handle = lib.gpreempt_scopes_open(address, doorbell, linger_s)
        if not self._handle:
            raise NativeGateUnavailable("the request counter could not be made (out of memory)")
        self._enter = lib.gpreempt_scopes_enter
        self._exit = lib.gpreempt_scopes_exit
        self._stat = lib.gpreempt_scopes_stat

    def enter(self, hint: bool) -> bool:
        """A scope opens; True if it raised the ``requests`` word (nothing held it raised)."""
        return bool(self._enter(self._handle, int(hint)))

    def exit(self) -> None:
        """A scope closes; the last one lets the word drop after the linger."""
        self._exit(self._handle)

    releases = _statistic(0, "Drops after a linger.")
    bridged = _statistic(1, "Requests that opened while the word still lingered.")
    wakes = _statistic(2, "Times a closing scope had to wake the helper (it was not polling).")
    deferred = _statistic(3, "Raises whose doorbell the helper rang at its next poll (quiet).")


def open_scopes(control: ControlBlock, linger_s: float) -> NativeScopes | None:
    """The native request counter of ``control``, which then stays mapped for the process's
    life (the counter's helper thread writes it); None where it cannot be built or loaded."""
    try:
        scopes = NativeScopes(control.address, control.doorbell, linger_s)
    except NativeGateUnavailable:
        return None
    control.keep_mapped()
    return scopes
