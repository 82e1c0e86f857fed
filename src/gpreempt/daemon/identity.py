"""Who a process is and whether the daemon may act on it.

Three guards the daemon applies wherever it registers a process or signals one:
- processes it must never stop: pid 1, the daemon itself and its ancestors (stopping one
  would stop the daemon, or the shell or supervisor that could restart it);
- a root daemon signals a task's process group with its owner's authority: the signal goes
  from a thread that took the owner's uid for that one call (``OwnerAuthority``), so the
  kernel delivers it to exactly the members the owner could signal (a job that ran ``sudo``
  has a root process in its group that its user could not stop). This costs two system
  calls, whatever the number of processes on the node. Where the daemon cannot change its
  uid (no CAP_SETUID), a group is signalled whole only when a scan of /proc finds every
  member to be the owner's (``GroupCensus``), else its leader alone;
- names shown to others are plain text: control characters and escape sequences in a task's
  name, or in a process's own name, are escaped so that ``status``, ``top`` and ``events``
  print what they received and nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Iterator

from ..procinfo import ancestors

#: Longest task name kept (after escaping).
MAX_NAME = 128


def protected_pids() -> frozenset[int]:
    """Pids no task may have: init, this daemon and its ancestors."""
    return frozenset({1, os.getpid(), *ancestors(os.getpid())})


def clean_name(name: str) -> str:
    """``name`` with every non-printable character escaped (``\\x1b``, ``\\n``, ...), cut to
    :data:`MAX_NAME` characters."""
    if name.isprintable():
        return name[:MAX_NAME]
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    return escaped[:MAX_NAME]


#: setresuid(2) by architecture: the raw call changes the calling thread alone (glibc's
#: wrapper would change every thread of the daemon).
_SETRESUID = {"x86_64": 117, "aarch64": 147, "ppc64le": 164}.get(platform.machine())


class OwnerAuthority:
    """Lends the daemon's loop thread a task owner's uid for one signal."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.available = os.geteuid() == 0 and _SETRESUID is not None and self._probe()

    def _set(self, ruid: int, euid: int) -> bool:
        return self._libc.syscall(_SETRESUID, ruid, euid, -1) == 0

    def _probe(self) -> bool:
        if not self._set(-1, 65534):
            return False
        if not self._set(-1, 0):  # cannot happen: the saved uid is still 0
            raise OSError(ctypes.get_errno(), "cannot take back uid 0")
        return True

    def usable(self, uid: int) -> bool:
        """Whether a signal to ``uid``'s tasks goes with its authority."""
        return self.available and uid != 0

    @contextlib.contextmanager
    def acting_as(self, uid: int) -> Iterator[None]:
        """Run the block with real and effective uid ``uid`` (the saved uid stays 0, so uid
        0 and the daemon's capabilities come back after it)."""
        if not self.usable(uid):
            yield
            return
        if not self._set(uid, uid):
            raise OSError(ctypes.get_errno(), f"cannot act as uid {uid}")
        try:
            yield
        finally:
            if not self._set(0, 0):
                raise SystemExit("gpreempt serve: cannot take back uid 0; stopping")


class GroupCensus:
    """Which process groups hold only processes of one user, from one scan of /proc.

    Only needed when the daemon runs as root: the kernel itself keeps an unprivileged daemon
    from signalling other users' processes. Built lazily once per scheduling pass, so
    stopping many tasks at once costs one scan, not one per task.
    """

    def __init__(self) -> None:
        self._owners: dict[int, set[int]] | None = None

    def owned_by(self, pgid: int, uid: int) -> bool:
        """Whether every member of group ``pgid`` runs with real, effective and saved uid
        ``uid`` (always true for root's tasks)."""
        if uid == 0:
            return True
        if self._owners is None:
            self._owners = _scan_groups()
        owners = self._owners.get(pgid)
        return owners is not None and owners == {uid}


def _scan_groups() -> dict[int, set[int]]:
    """Every uid (real, effective, saved) found in each process group."""
    groups: dict[int, set[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            pgid = int(stat[stat.rindex(b")") + 2 :].split()[2])
            with open(f"/proc/{entry}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        groups.setdefault(pgid, set()).update(int(u) for u in line.split()[1:4])
                        break
        except (OSError, ValueError, IndexError):
            continue
    return groups
