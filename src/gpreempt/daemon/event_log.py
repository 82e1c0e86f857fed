"""The daemon's event log: one JSON object per line in ``<runtime_dir>/events.jsonl``.

Each line has ``t`` (unix time), ``mono`` (monotonic time), ``gpu``, ``task``, ``task_id``,
``pid``, ``event`` (registered, active, idle, suspend, resume, backstop, hold, release, evict,
restore, exit, error), ``mechanism``, ``latency_ms`` (how long the mechanism's call took) and
``reason``. Readers (``gpreempt events``, the bench) parse it line by line.

A busy GPU logs many events a second: every request of an inference server suspends and
resumes the tasks below it. Three trainers under a server at 374 requests/s logged about 1600
events (270 kB) a second (benchmarks/gate-frontier/2026-11-22-h200/run28/bench/bg3-side), about
1 GB an hour, and the runtime directory often lives in memory. So the log
is rotated: past ``max_bytes`` it becomes ``events.jsonl.1`` (replacing the previous one) and
a new ``events.jsonl`` begins; at most twice ``max_bytes`` is kept.

A log that cannot be written (a full disk, a deleted directory) never stops the daemon: the
records that could not be written are counted (:attr:`EventLog.failed`, shown by ``status``)
and the daemon goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

EVENT_KINDS = frozenset(
    {
        "registered",
        "active",
        "idle",
        "suspend",
        "resume",
        "backstop",
        "hold",
        "release",
        "evict",
        "restore",
        "exit",
        "error",
        "degraded",
        "daemon-start",
        "daemon-stop",
    }
)


#: Size at which the log is rotated, by default.
DEFAULT_MAX_BYTES = 64 * 2**20


def rotated_path(path: Path) -> Path:
    """Where the previous generation of the log at ``path`` lies."""
    return path.with_name(path.name + ".1")


class EventLog:
    """Appends events to the log file; each write is one line, flushed at once, except inside
    :meth:`batch`. Rotated past ``max_bytes`` (see the module's docstring)."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        #: Records that could not be written, and why the last one could not.
        self.failed = 0
        self.last_error: str | None = None
        self._fd = -1
        self._size = 0
        self._open()
        self._held: list[dict[str, Any]] | None = None

    def _open(self) -> None:
        """(Re)open the log file; on failure, count it and write nothing until it opens."""
        try:
            fd = os.open(
                self.path,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW,
                0o600,
            )
        except OSError as exc:
            self.last_error = f"cannot open {self.path}: {exc.strerror or exc}"
            return
        self._size = os.fstat(fd).st_size
        self._fd = fd

    def reopen(self) -> None:
        """Start writing to whatever file the path names now (a recreated directory)."""
        self._close_fd()
        self._open()

    def _append(self, text: str, records: int = 1) -> None:
        """Write whole lines (ASCII: ``json.dumps`` escapes the rest), rotating after them.
        Never raises: what cannot be written is counted."""
        if self._fd < 0:
            self._open()
            if self._fd < 0:
                self.failed += records
                return
        data = text.encode()
        try:
            written = os.write(self._fd, data)
        except OSError as exc:
            self.failed += records
            self.last_error = f"cannot write {self.path}: {exc.strerror or exc}"
            return
        if written < len(data):  # disk full mid-line: end the torn line so readers skip it
            self.failed += records
            self.last_error = f"cannot write {self.path}: short write (disk full?)"
            with contextlib.suppress(OSError):
                os.write(self._fd, b"\n")
        self._size += written
        if self._size > self.max_bytes:
            try:
                os.replace(self.path, rotated_path(self.path))
            except OSError:
                self._size = 0  # keep writing here; try again after another max_bytes
                return
            self.reopen()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the records written inside and write them at the end, in order: the daemon
        closes every gate a request needs closed before it spends time on the log."""
        if self._held is not None:  # nested: the outer batch writes
            yield
            return
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            if held:
                self._append("".join(_line(r) for r in held), len(held))

    def write(
        self,
        event: str,
        *,
        task: str | None = None,
        task_id: int | None = None,
        pid: int | None = None,
        gpu: int | None = None,
        mechanism: str | None = None,
        latency_ms: float | None = None,
        reason: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        record: dict[str, Any] = {
            "t": time.time(),
            "mono": time.monotonic(),
            "gpu": gpu,
            "task": task,
            "task_id": task_id,
            "pid": pid,
            "event": event,
            "mechanism": mechanism,
            "latency_ms": None if latency_ms is None else round(latency_ms, 4),
            "reason": reason,
        }
        record.update(extra)
        if self._held is not None:
            self._held.append(record)
        else:
            self._append(_line(record))
        return record

    def close(self) -> None:
        self._close_fd()


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), default=str) + "\n"


def parse_event(line: str) -> dict[str, Any] | None:
    """One log line as an event, or None if it is not a JSON object (a torn or foreign line)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events in a log file, skipping lines that are not valid events."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            record = parse_event(line)
            if record is not None:
                yield record


def read_all_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of the log at ``path`` and of its previous generation, oldest first."""
    for part in (rotated_path(path), path):
        if part.exists():
            yield from read_events(part)


def follow_events(path: Path, poll_s: float = 0.2) -> Iterator[dict[str, Any]]:
    """Events as they are appended (like ``tail -f``), starting from the end of the file and
    going on into the new file when the log is rotated."""
    while not path.exists():
        time.sleep(poll_s)
    f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - reopened on rotation
    try:
        f.seek(0, os.SEEK_END)
        partial = ""
        while True:
            chunk = f.readline()
            if not chunk:
                if _rotated(path, f):
                    f.close()
                    f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
                    continue
                time.sleep(poll_s)
                continue
            partial += chunk
            if not partial.endswith("\n"):
                continue
            record = parse_event(partial)
            partial = ""
            if record is not None:
                yield record
    finally:
        f.close()


def _rotated(path: Path, f: IO[str]) -> bool:
    """Whether ``path`` names another file than the open ``f`` (the log was rotated)."""
    try:
        return os.stat(path).st_ino != os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return False  # between the rename and the new file: look again later
