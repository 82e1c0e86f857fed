"""What must outlive the daemon: which processes it left suspended, and how.

Recorded *before* the daemon acts: a process is written down (and the file synced) before it
is stopped by a signal, locked in the driver or has its queues unmapped, so that a daemon
killed with SIGKILL at any instant is replaced by one that resumes it. A stop that cannot be
recorded (a full disk) is not made: the task shows as ``unprotected`` instead. The file is
rewritten again after the pass, when what it records changed. A process is identified by
its pid *and* its start time, so a recycled pid is never signalled.

Also kept: the tasks registered with ``attach`` (``attached.json``), which no launcher or
in-process client would register again, so that a restarted daemon goes on preempting them.
A failed write (a full disk) raises OSError for the daemon to count; it never corrupts the
previous file, which is replaced only by a complete new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import GpreemptError
from ..mechanisms import MechanismName, kind
from ..mechanisms.base import Target
from ..procinfo import alive, open_verified

if TYPE_CHECKING:
    from .task import Task

#: What a state record names as its mechanism for a task whose memory was evicted.
EVICTED = "evict"
#: The mechanism whose leftovers a record's other name leaves: an evicted task is held by the
#: driver lock (its memory restored as the lock is undone).
LEFT_BY = {EVICTED: MechanismName.LOCK}


@dataclass(frozen=True)
class SuspendedRecord:
    pid: int
    pgid: int | None
    start_time: int
    #: The concrete mechanism that suspended it: signal, lock, gate or evict.
    mechanism: str
    name: str


@dataclass(frozen=True)
class AttachedRecord:
    """A task registered with ``attach``: what registers it again after a restart."""

    pid: int
    start_time: int
    uid: int
    name: str
    priority: int
    gpus: list[int]
    mechanism: str
    always_active: bool
    timeslice_ms: float | None
    min_share: float | None
    reserve_bytes: int


ATTACHED_NAME = "attached.json"


def save(path: Path, records: list[Any]) -> None:
    """Atomically replace the state file (records: dataclasses). Raises OSError on failure,
    leaving the previous file as it was."""
    tmp = path.with_suffix(".tmp")
    data = json.dumps([asdict(r) for r in records], indent=1).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _load_raw(path: Path) -> list[Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            raw = json.loads(f.read(16 * 2**20))
    except (OSError, ValueError):
        return []
    return raw if isinstance(raw, list) else []


def load(path: Path) -> list[SuspendedRecord]:
    records = []
    for item in _load_raw(path):
        try:
            records.append(SuspendedRecord(**item))
        except TypeError:
            continue
    return records


def load_attached(path: Path) -> list[AttachedRecord]:
    """The attached tasks a previous daemon recorded (malformed entries skipped)."""
    records = []
    for item in _load_raw(path):
        try:
            record = AttachedRecord(**item)
        except TypeError:
            continue
        if all(
            isinstance(v, int) and not isinstance(v, bool)
            for v in (record.pid, record.start_time, record.uid, record.priority)
        ):
            records.append(record)
    return records


def resume_leftovers(path: Path) -> list[tuple[SuspendedRecord, str]]:
    """Resume every still-living process a previous daemon left suspended.

    Returns (record, outcome) pairs for the event log. Each process's mechanism undoes what
    it left (:meth:`~gpreempt.mechanisms.base.Mechanism.undo_leftovers`), then the process is
    continued. Gate-suspended processes need nothing: their client reopens its own gate when
    the daemon's connection drops.
    """
    outcomes = []
    for record in load(path):
        if not alive(record.pid, record.start_time):
            outcomes.append((record, "gone"))
            continue
        target = Target(pid=record.pid, pgid=record.pgid)
        try:
            kind(LEFT_BY.get(record.mechanism, record.mechanism)).undo_leftovers(target)
            if record.pgid:
                os.killpg(record.pgid, signal.SIGCONT)
            else:
                pidfd = open_verified(record.pid, record.start_time)
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGCONT)
                finally:
                    os.close(pidfd)
            outcomes.append((record, "resumed"))
        except (OSError, GpreemptError) as exc:
            outcomes.append((record, f"failed: {exc}"))
    with contextlib.suppress(OSError):  # a full disk: the next write tries again
        save(path, [])
    return outcomes


def _stopped_with(task: Task) -> str:
    """What a successor must undo for a stopped ``task``: its eviction, the backstop's lock or
    signals behind its gate, or the mechanism that suspended it."""
    if task.evicted:
        return EVICTED
    if task.backstop_locked:
        return MechanismName.LOCK
    if task.backstop_signalled:
        return MechanismName.SIGNAL
    return task.suspended_with or MechanismName.SIGNAL


class StateFiles:
    """The daemon's two state files in its runtime directory, each rewritten only when what
    it records changes; a failed write (a full disk) is counted and shown, never fatal."""

    def __init__(self, runtime_dir: Path, state_name: str, log: Callable[[str], None]) -> None:
        self.state_path = runtime_dir / state_name
        self.attached_path = runtime_dir / ATTACHED_NAME
        self.log = log
        #: What each file holds now (None: not written yet).
        self._suspended: list[SuspendedRecord] | None = None
        self._attached: list[AttachedRecord] | None = None
        #: Writes that failed, and the last reason.
        self.write_failures = 0
        self.last_error: str | None = None

    def save_suspended(self, tasks: Iterable[Task], about_to: dict[int, str] | None = None) -> bool:
        """Record what a successor must resume if this daemon dies, when that changes;
        ``about_to``: tasks (by id) the daemon is about to stop, and the concrete mechanism
        it will use (recorded before it acts). Returns whether the file now says so.

        Tasks held by their gate alone are left out: their client reopens its own gate when
        the daemon goes away. So the many short gate preemptions cost no write here.
        """
        tasks = list(tasks)
        pending = about_to or {}
        records = [
            SuspendedRecord(
                pid=t.pid,
                pgid=t.identity.pgid,
                start_time=t.identity.start_time,
                mechanism=_stopped_with(t),
                name=t.name,
            )
            for t in tasks
            if t.evicted
            or (
                t.suspended
                and (
                    not kind(t.suspended_with).in_process
                    or t.backstop_locked
                    or t.backstop_signalled
                )
            )
        ]
        listed = {r.pid for r in records}
        records += [
            SuspendedRecord(
                pid=t.pid,
                pgid=t.identity.pgid,
                start_time=t.identity.start_time,
                mechanism=pending[t.task_id],
                name=t.name,
            )
            for t in tasks
            if t.task_id in pending and t.pid not in listed
        ]
        if records == self._suspended:
            return True
        if self._save(self.state_path, records):
            self._suspended = records
            return True
        return False

    def save_attached(self, tasks: Iterable[Task]) -> bool:
        """Record the tasks registered with ``attach`` for a restarted daemon, when they
        change; returns whether the file now says so."""
        records = [
            AttachedRecord(
                pid=t.pid,
                start_time=t.identity.start_time,
                uid=t.uid,
                name=t.name,
                priority=t.priority,
                gpus=list(t.identity.gpus),  # those its processes add come back with them
                mechanism=t.mechanism,
                always_active=t.identity.always_active,
                timeslice_ms=t.identity.timeslice_ms,
                min_share=t.identity.min_share,
                reserve_bytes=t.identity.reserve_bytes,
            )
            for t in tasks
            if t.attached
        ]
        if records == self._attached:
            return True
        if self._save(self.attached_path, records):
            self._attached = records
            return True
        return False

    def forget(self) -> None:
        """Write both files again at the next save (the directory was recreated)."""
        self._suspended = None
        self._attached = None

    def _save(self, path: Path, records: list[Any]) -> bool:
        try:
            save(path, records)
        except OSError as exc:
            self.write_failures += 1
            self.last_error = f"cannot write {path}: {exc.strerror or exc}"
            self.log(self.last_error)
            return False
        return True
