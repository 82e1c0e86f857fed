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

A task whose gate holds on the GPU (:attr:`Task.held_on_gpu`) is left alone, while only tasks
of its own user outrank it on its GPUs (its gate's words are its client's word): its driver-level
gate sees every launch of the process and puts stream barriers on every stream, or its operator
gate's barriers hold what it queued on its stream; a lock would wait for that held work until the
request ended, then stop the task's CPU while it unlocks. A driver-level gate that is not on
(released to a profiler, its CUPTI subscriber taken) leaves work unseen: the lock backs it up.

A suspension is checked, not assumed: once a task's gate has held it for :data:`SETTLE_MS`, while
its gate word is closed outright (a hold by hand, or a watch list the gate does not have yet) the
launches its driver-level gates saw must stand still (each held thread counts the one launch it
holds). If they move on, the task's work escaped its gate: that is an ``error`` event, a count in
its status (``hold_leaks``), and the driver lock for the rest of the suspension.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable

from ..errors import GpreemptError
from ..mechanisms import MechanismName, kind
from ..mechanisms.cuda_driver import CheckpointDriver, ProcessState
from .event_log import EventLog
from .registry import Registry, Task

#: How long a task stays held by its gate before the lock backs it up, by default.
DEFAULT_DELAY_MS = 50.0
#: How long one backstop lock may wait for the task's queued work.
LOCK_TIMEOUT_MS = 1000
#: After this long held, a gated task's launches must stand still.
SETTLE_MS = 200.0
#: How often they are looked at, while it stays suspended.
CHECK_PERIOD_MS = 100.0
#: Launches a held process may still count per channel (a launch per thread it holds).
LEAK_SLACK = 16


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
            and not (task.held_on_gpu and not self._for_another_user(task))
            and not task.backstop_locked
            and task.task_id not in self._locking
            and task.task_id not in self._failed
        )

    def _for_another_user(self, task: Task) -> bool:
        """Whether a more important task of another user shares a GPU with ``task``: its
        gate's own words (barriers on, driver-level gate on) then do not spare it the lock.
        What a client writes in its block may only hurt its own user: a task that claims a
        gate it does not have is locked like any other once the delay has passed."""
        return any(
            other.uid != task.uid
            and other.priority > task.priority
            and not other.held
            and set(other.gpus) & set(task.gpus)
            for other in self.registry.tasks.values()
        )

    @staticmethod
    def _checked(task: Task) -> bool:
        """Whether the task's hold is checked now: its gate holds it, and it has a driver-level
        gate that counts its launches."""
        return (
            task.suspended
            and kind(task.suspended_with).in_process
            and task.preempted_since is not None
            and not task.hold_leaked
            and task.driver_gate == "on"
        )

    def next_due(self, now: float | None = None) -> float | None:
        """Daemon time (monotonic) at which a task next needs its lock or a check, if any."""
        now = time.monotonic() if now is None else now
        due = [
            max(t.preempted_since + SETTLE_MS / 1e3, now + CHECK_PERIOD_MS / 1e3)
            if t.hold_baseline is not None
            else t.preempted_since + SETTLE_MS / 1e3
            for t in self.registry.tasks.values()
            if self._checked(t) and t.preempted_since is not None
        ]
        if self.enabled:
            due += [
                t.preempted_since + self.delay_s
                for t in self.registry.tasks.values()
                if self._eligible(t) and t.preempted_since is not None
            ]
        return min(due) if due else None

    def check_holds(self, now: float) -> None:
        """Find suspensions whose work goes on (module docstring)."""
        for task in self.registry.tasks.values():
            if not self._checked(task) or task.preempted_since is None:
                continue
            if now < task.preempted_since + SETTLE_MS / 1e3:
                continue
            launches = task.driver_launches
            if task.hold_baseline is None or not self._must_stand_still(task):
                task.hold_baseline = launches  # counted from the next check
                continue
            moved = launches - task.hold_baseline
            if moved <= LEAK_SLACK * max(1, len(task.controls)):
                continue
            task.hold_leaked = True
            task.hold_leaks += 1
            fallback = "the driver lock backs it up" if self.enabled else "no driver lock here"
            self.events.write(
                "error",
                **task.event_fields(),
                mechanism=task.suspended_with,
                reason=(
                    f"its suspension does not hold: {moved} launches while its gate was "
                    f"closed; {fallback}"
                ),
            )

    @staticmethod
    def _must_stand_still(task: Task) -> bool:
        """Whether its gate stops every launch on the CPU now: the word of one of its gates is
        closed outright (odd). A gate closed only while watched tasks are active (2V) goes on
        by itself once none is, and while one is, its barriers hold the work on the GPU and
        the CPU may queue on behind them (docs/gate.md): its launches then prove nothing."""
        return any(c.gate_word % 2 == 1 for c in task.controls.values())

    def apply(self, now: float) -> None:
        """Check the holds; start locking every task held by its gate for the delay or longer
        (at once for one whose hold leaks)."""
        self.check_holds(now)
        if not self.enabled:
            return
        for task in list(self.registry.tasks.values()):
            if self._eligible(task) and (
                task.hold_leaked or now >= task.preempted_since + self.delay_s
            ):
                recorded = self._record is None or self._record({task.task_id: MechanismName.LOCK})
                if not recorded:
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
                        mechanism=MechanismName.LOCK,
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
                    mechanism=MechanismName.LOCK,
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
        task.hold_baseline = None
        task.hold_leaked = False
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
                    mechanism=MechanismName.LOCK,
                    reason=f"backstop unlock failed: {exc}",
                )
