"""Wait on a word of shared memory and wake its waiters (Linux ``futex``).

A closed gate waits for its ``gate_closed`` word to turn zero. It polls, so it would notice
anyway; the daemon wakes it with ``FUTEX_WAKE`` right after opening, so the task resumes within
microseconds instead of at its next poll. The wake is an optimisation only: where the system
call is unavailable (another OS, an architecture whose number is not known here) :func:`wake`
does nothing, :func:`wait` just sleeps, and the waiter's poll takes over.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import time

#: ``SYS_futex`` per machine architecture (asm-generic numbering for arm64 and riscv64).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98, "ppc64le": 221}
_FUTEX_WAIT = 0  # shared, not FUTEX_PRIVATE_FLAG: the waker is another process
_FUTEX_WAKE = 1
_WAKE_ALL = 0x7FFFFFFF


def _syscall() -> tuple[object, int] | None:
    if not sys.platform.startswith("linux"):
        return None
    number = _SYS_FUTEX.get(platform.machine())
    if number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return fn, number


_CALL = _syscall()


def available() -> bool:
    """Whether :func:`wake` issues the system call on this machine."""
    return _CALL is not None


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at ``address`` holds ``expected``, until a :func:`wake` on it
    or ``timeout_s`` (the caller looks at the word again either way; without the system call
    this just sleeps ``timeout_s``)."""
    if _CALL is None or address == 0:
        time.sleep(timeout_s)
        return
    fn, number = _CALL
    timeout = _Timespec(int(timeout_s), int(timeout_s % 1 * 1e9))
    fn(number, address, _FUTEX_WAIT, expected, ctypes.byref(timeout))  # type: ignore[operator]


def wake(address: int) -> int:
    """Wake every thread waiting on the 32-bit word at ``address``; the number woken, or 0.

    ``address`` must lie in a live mapping of this process (a futex on a shared mapping wakes
    waiters of every process that maps the same page).
    """
    if _CALL is None or address == 0:
        return 0
    fn, number = _CALL
    woken = fn(number, address, _FUTEX_WAKE, _WAKE_ALL)  # type: ignore[operator]
    return max(0, int(woken))
