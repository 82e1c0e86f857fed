"""The driver lock behind the gate, for tasks whose mechanism is ``auto``.

A closed gate stops the launches that go through PyTorch's dispatcher. Work it cannot see goes
on: kernels a thread launches without an operator (custom extensions, code that
``torch.compile`` generated, threads of other languages). So once a task with mechanism
``auto`` has been held by its gate for ``delay_ms`` (for a more important task, or by hand;
waiting for its turn among peers does not count), the daemon also locks it in the driver,
which stops every CUDA call of the process, and lifts that lock before the gate opens.

The delay keeps the lock's cost off the many short preemptions the gate handles alone: a lock
call waits for the work already queued (1.5 ms at P50 on an H200). The call runs on a helper
thread, so the daemon keeps answering while it waits.

A gate that puts stream barriers (``barriers_on`` in its control block) is left alone: the GPU
itself holds what the process queued behind the last barrier on its stream, work the gate never
saw included (a graph replay, a Triton kernel of ``torch.compile``, an extension's kernel on the
current stream), and a lock would wait for that held work until the request ended, then stop
the task's CPU while it unlocks. Work such a task puts on other streams is not held.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable

from ..errors import GpreemptError
from ..mechanisms import kind
from ..mechanisms.cuda_driver import CheckpointDriver, ProcessState
from .event_log import EventLog
from .registry import Registry, Task

#: How long a task stays held by its gate before the lock backs it up, by default.
DEFAULT_DELAY_MS = 50.0
#: How long one backstop lock may wait for the task's queued work.
LOCK_TIMEOUT_MS = 1000


class Backstop:
    """Locks gate-held ``auto`` tasks after a delay; unlocks them before they resume.

    It reads the tasks of ``registry`` and writes what it does to ``events``;
    ``lock_available``: whether this machine's driver offers the lock (without a ``driver``
    given, the backstop is off where it does not). ``wake_fd`` is written to when a lock
    call finishes, to wake the daemon's loop, which then calls :meth:`collect`.
    """

    def __init__(
        self,
        registry: Registry,
        events: EventLog,
        delay_ms: float = DEFAULT_DELAY_MS,
        driver: CheckpointDriver | None = None,
        *,
        lock_available: bool = True,
        wake_fd: int | None = None,
        record: Callable[[dict[int, str]], bool] | None = None,
    ) -> None:
        self.registry = registry
        self.events = events
        self.lock_available = lock_available
        self.delay_s = delay_ms / 1e3
        self._driver = driver
        self._wake_fd = wake_fd
        #: Records a lock before it is taken (persist.py); False: it could not, so no lock.
        self._record = record
        #: Tasks a helper thread is locking now (a locked task has ``backstop_locked`` set).
        self._locking: set[int] = set()
        #: Tasks resumed while their lock was still being taken: unlock when it is.
        self._cancelled: set[int] = set()
        #: Tasks the driver could not lock during this suspension: not tried again until then.
        self._failed: set[int] = set()
        #: (task id, pid, call ms, error) of finished lock calls, from the helper threads.
        self._done: queue.SimpleQueue[tuple[int, int, float, str | None]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    @property
    def enabled(self) -> bool:
        return self.delay_s > 0 and (self._driver is not None or self.lock_available)

    @property
    def driver(self) -> CheckpointDriver:
        return self._driver if self._driver is not None else CheckpointDriver.get()

    def _eligible(self, task: Task) -> bool:
        return (
            kind(task.mechanism).backed_up
            and task.suspended
            and kind(task.suspended_with).in_process
            and task.preempted_since is not None
            and not task.barriers_on
            and not task.backstop_locked
            and task.task_id not in self._locking
            and task.task_id not in self._failed
        )

    def next_due(self) -> float | None:
        """Daemon time (monotonic) at which a task next needs its lock, if any does."""
        if not self.enabled:
            return None
        due = [
            t.preempted_since + self.delay_s
            for t in self.registry.tasks.values()
            if self._eligible(t)
        ]
        return min(due) if due else None

    def apply(self, now: float) -> None:
        """Start locking every task held by its gate for the delay or longer."""
        if not self.enabled:
            return
        for task in list(self.registry.tasks.values()):
            if self._eligible(task) and now >= task.preempted_since + self.delay_s:
                if self._record is not None and not self._record({task.task_id: "lock"}):
                    self._failed.add(task.task_id)  # a lock nobody could lift after a crash
                    continue
                self._locking.add(task.task_id)
                thread = threading.Thread(
                    target=self._lock, args=(task.task_id, task.pid), daemon=True
                )
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
                thread.start()

    def _lock(self, task_id: int, pid: int) -> None:
        start = time.perf_counter()
        error = None
        try:
            if self.driver.state(pid) != ProcessState.LOCKED:
                self.driver.lock(pid, LOCK_TIMEOUT_MS)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the loop must hear of it
            error = str(exc) if isinstance(exc, GpreemptError) else repr(exc)
        self._done.put((task_id, pid, (time.perf_counter() - start) * 1e3, error))
        if self._wake_fd is not None:
            try:
                os.write(self._wake_fd, b"\0")
            except OSError:
                pass  # the loop polls at least every liveness period anyway

    def collect(self) -> bool:
        """Take in finished lock calls; returns True if a task is now locked (persist it)."""
        locked = False
        while True:
            try:
                task_id, pid, latency_ms, error = self._done.get_nowait()
            except queue.Empty:
                return locked
            task = self.registry.tasks.get(task_id)
            cancelled = task_id in self._cancelled or task is None or not task.suspended
            self._cancelled.discard(task_id)
            self._locking.discard(task_id)
            if error is not None:
                if task is not None:
                    self._failed.add(task_id)
                    self.events.write(
                        "error",
                        **task.event_fields(),
                        mechanism="lock",
                        reason=f"backstop lock failed: {error}",
                    )
            elif cancelled:  # resumed or gone while the lock was being taken
                self._unlock(pid, task)
            else:
                task.backstop_locked = True
                locked = True
                self.events.write(
                    "backstop",
                    **task.event_fields(),
                    mechanism="lock",
                    latency_ms=latency_ms,
                    reason=f"held by its gate for {self.delay_s * 1e3:g} ms",
                )

    def finish(self) -> None:
        """Wait for the lock calls under way and lift the locks of tasks that resumed."""
        for thread in self._threads:
            thread.join()
        self._threads = []
        self.collect()

    def release(self, task: Task) -> None:
        """Before ``task`` resumes: lift its lock, or have it lifted once it is taken."""
        self._failed.discard(task.task_id)
        if task.task_id in self._locking:
            self._cancelled.add(task.task_id)
        elif task.backstop_locked:
            task.backstop_locked = False
            self._unlock(task.pid, task)

    def _unlock(self, pid: int, task: Task | None) -> None:
        try:
            if self.driver.state(pid) == ProcessState.LOCKED:
                self.driver.unlock(pid)
        except GpreemptError as exc:
            if task is not None:
                self.events.write(
                    "error",
                    **task.event_fields(),
                    mechanism="lock",
                    reason=f"backstop unlock failed: {exc}",
                )
