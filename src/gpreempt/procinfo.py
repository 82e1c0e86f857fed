"""Facts about processes read from /proc: owner, group, start time, parentage, stop state,
the GPUs they can use."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .errors import NoSuchProcess

#: The CPU-time clock of a whole process (clock_getcpuclockid's encoding, CPUCLOCK_SCHED:
#: the scheduler's nanosecond count rather than ticks).
_CPUCLOCK_SCHED = 2


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    pgid: int
    #: Real uid of the process.
    uid: int
    #: Start time in clock ticks since boot: with the pid, identifies the process across reuse.
    start_time: int
    #: One-letter state from /proc/PID/stat (R, S, T = stopped, Z, ...).
    state: str
    name: str
    #: Real, effective and saved uids: who may signal it (a setuid program differs in these).
    uids: tuple[int, int, int] = (0, 0, 0)


def read_process(pid: int) -> ProcessInfo:
    """Read /proc/PID; raise NoSuchProcess with a clear message if it is gone."""
    if pid <= 0:
        raise NoSuchProcess(f"pid {pid} is not a valid process id")
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        raise NoSuchProcess(f"no process with pid {pid} (it may have exited)") from None
    # The name is in parentheses and may itself contain spaces or parentheses.
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    uids = (0, 0, 0)
    for line in status.splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            uids = (int(parts[1]), int(parts[2]), int(parts[3]))
            break
    uid = uids[0]
    state = fields[0]
    if state in ("Z", "X"):
        raise NoSuchProcess(f"process {pid} has exited (zombie)")
    return ProcessInfo(
        pid=pid,
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        uid=uid,
        start_time=int(fields[19]),
        state=state,
        name=name,
        uids=uids,
    )


def alive(pid: int, start_time: int | None = None) -> bool:
    """Whether ``pid`` runs (and, if given, is the same process that started at ``start_time``)."""
    try:
        info = read_process(pid)
    except NoSuchProcess:
        return False
    return start_time is None or info.start_time == start_time


def ancestors(pid: int) -> list[int]:
    """``pid``'s parent, its parent and so on up to pid 1 (as far as they can be read)."""
    chain: list[int] = []
    while pid > 1 and len(chain) < 256:
        try:
            pid = read_process(pid).ppid
        except NoSuchProcess:
            break
        if pid <= 0:
            break
        chain.append(pid)
    return chain


def start_time_of(pid: int) -> int:
    """Start time of ``pid`` (clock ticks since boot), from /proc/PID/stat alone (cheap)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        raise NoSuchProcess(f"no process with pid {pid} (it may have exited)") from None
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        raise NoSuchProcess(f"process {pid} has exited (zombie)")
    return int(fields[19])


def cpu_time_ns(pid: int) -> int | None:
    """CPU time (user and system, ns) all threads of ``pid`` have used so far, as the kernel
    counts it (the process's CPU-time clock: one call, no /proc read); None if it is gone.
    Nothing the process writes can change it."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED)
    except (OSError, OverflowError):
        return None


def open_verified(pid: int, start_time: int | None) -> int:
    """A pidfd of ``pid``, checked to be the process that started at ``start_time``: signals
    sent through it can never reach a process that took a recycled pid. Raises NoSuchProcess
    if the process is gone or is another one now."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise NoSuchProcess(f"process {pid} has exited") from None
    try:
        started = start_time_of(pid)
        if start_time is not None and started != start_time:
            raise NoSuchProcess(f"process {pid} has exited (its pid now names another process)")
    except BaseException:
        os.close(pidfd)
        raise
    return pidfd


def is_descendant(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        try:
            pid = read_process(pid).ppid
        except NoSuchProcess:
            return False
        seen += 1
    return pid == ancestor


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if read_process(int(entry)).pgid == pgid:
                    members.append(int(entry))
            except (NoSuchProcess, OSError, ValueError, IndexError):
                continue
    return members


def _pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def pid_seen_by_peer(pid: int, peer: int) -> int:
    """The pid, in our PID namespace, of the process that ``peer`` (a pid in ours, as
    SO_PEERCRED gives it) calls ``pid`` in its own namespace.

    A client in a container (its own PID namespace) names processes by its pids; the daemon
    (the host's namespace, hostPID on Kubernetes) must act on the same process under its
    pid. The match is the process of the peer's namespace whose innermost pid (the last of
    ``NSpid`` in /proc/PID/status) is ``pid``. Same namespace: ``pid`` itself.
    """
    theirs = _pid_namespace(peer)
    if theirs is None or theirs == _pid_namespace("self"):
        return pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or _pid_namespace(entry) != theirs:
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                for line in f.read().decode(errors="replace").splitlines():
                    if line.startswith("NSpid:"):
                        if int(line.split()[-1]) == pid:
                            return int(entry)
                        break
        except (OSError, ValueError):
            continue
    raise NoSuchProcess(f"no process with pid {pid} in the caller's PID namespace")


def can_use_gpu(pid: int, gpu: int) -> bool:
    """Whether process ``pid`` can use NVIDIA GPU ``gpu``: its device node is there in the
    process's own root (a container sees only the GPUs it was given). Where the process
    sees no NVIDIA device node at all (another vendor, no GPU), nothing can be told: yes."""
    dev = f"/proc/{pid}/root/dev"
    try:
        names = os.listdir(dev)
    except OSError:
        return False
    nodes = {n for n in names if n.startswith("nvidia") and n[6:].isdigit()}
    return not nodes or f"nvidia{gpu}" in nodes
