"""What must outlive the daemon: which processes it left suspended, and how.

Written on every change of the suspended set, so that a daemon killed with SIGKILL can be
replaced by one that resumes those processes. A process is identified by its pid *and* its
start time, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import GpreemptError
from ..mechanisms.base import Target
from ..mechanisms.cuda_driver import try_driver
from ..procinfo import alive


@dataclass(frozen=True)
class SuspendedRecord:
    pid: int
    pgid: int | None
    start_time: int
    #: The concrete mechanism that suspended it: signal, lock, gate or evict.
    mechanism: str
    name: str


def save(path: Path, records: list[SuspendedRecord]) -> None:
    """Atomically replace the state file."""
    tmp = path.with_suffix(".tmp")
    data = json.dumps([asdict(r) for r in records], indent=1)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def load(path: Path) -> list[SuspendedRecord]:
    try:
        raw = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    records = []
    for item in raw if isinstance(raw, list) else []:
        try:
            records.append(SuspendedRecord(**item))
        except TypeError:
            continue
    return records


def resume_leftovers(path: Path) -> list[tuple[SuspendedRecord, str]]:
    """Resume every still-living process a previous daemon left suspended.

    Returns (record, outcome) pairs for the event log. Gate-suspended processes need nothing:
    their client reopens its own gate when the daemon's connection drops.
    """
    outcomes = []
    for record in load(path):
        if not alive(record.pid, record.start_time):
            outcomes.append((record, "gone"))
            continue
        target = Target(pid=record.pid, pgid=record.pgid)
        try:
            if record.mechanism in ("lock", "evict"):
                resume_locked(target)
            if record.mechanism == "kfd":  # its queues, through its launcher's tracer
                from ..mechanisms.kfd import request

                with contextlib.suppress(GpreemptError):
                    request(record.pid, "resume")
            if record.pgid:
                os.killpg(record.pgid, signal.SIGCONT)
            else:
                os.kill(record.pid, signal.SIGCONT)
            outcomes.append((record, "resumed"))
        except (OSError, GpreemptError) as exc:
            outcomes.append((record, f"failed: {exc}"))
    save(path, [])
    return outcomes


def resume_locked(target: Target) -> None:
    """Unlock (and restore first, if checkpointed) a process the driver holds."""
    from ..mechanisms.cuda_driver import ProcessState

    driver = try_driver()
    if driver is None:
        return
    try:
        state = driver.state(target.pid)
    except GpreemptError:
        return
    if state == ProcessState.CHECKPOINTED:
        driver.restore(target.pid)
        state = driver.state(target.pid)
    if state == ProcessState.LOCKED:
        driver.unlock(target.pid)
