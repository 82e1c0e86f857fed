"""The driver lock, or signals, behind the gate.

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

Where the driver has no lock (no NVIDIA driver r570+: CPU machines, AMD), signals
(SIGSTOP/SIGCONT of the task, as mechanism ``signal`` sends them, by the executor) take its
place, for fewer tasks: those below another user's task (whose gate words nobody else need
believe) once held ``delay_ms``, and those whose gate was found not to hold. A lock that fails
falls back to them.

A suspension is checked, not assumed: once a task's gate has held it for :data:`SETTLE_MS`,
while its gate word is closed outright (a hold by hand, or a watch list the gate does not have
yet) the launches its driver-level gates saw must stand still (each held thread counts the one
launch it holds), as must those of a task without barriers held only while a task it watches is
active, between two looks that find that task active and its activity epoch unchanged
(watch_hold.py); and while every word of it is closed outright, its processes must not
keep running on the CPU, by the kernel's count (hold_meter.py). If either goes on, the task's
work escaped its gate: that is an ``error`` event, a count in its status (``hold_leaks``), the
lock or signals at once, and its gate's words no longer count (``gate_untrusted``: it is backed
up at once at every later suspension, mechanism ``gate`` included, and takes no turns among
peers).

These rules are pure functions over frozen facts (backstop_plan.py); the executor (apply.py)
carries out what they return, with the lock calls of this module's :class:`Backstop`.
"""

from __future__ import annotations

import os
import queue
import threading
import time

from ..errors import GpreemptError
from ..mechanisms import MechanismName, kind
from ..mechanisms.cuda_driver import NOT_SUPPORTED, CheckpointDriver, CudaDriverError, ProcessState
from . import backstop_plan
from .backstop_plan import BackstopPlan, CpuWindow, HoldFacts
from .event_log import EventLog
from .gpu_busy import PERIOD_S, GpuBusy
from .hold_meter import HoldMeter
from .registry import Registry
from .task import Task
from .watch_hold import Watching, held_by_watch

#: How long a task stays held by its gate before the lock backs it up, by default.
DEFAULT_DELAY_MS = 50.0
#: How long one backstop lock may wait for the task's queued work.
LOCK_TIMEOUT_MS = 1000
#: How far into a hold outright its task's GPUs are watched through NVML (s): its samples count
#: only from GPU_SETTLE_S on, and the first read reaches two sampling periods back. Holds that
#: end sooner, as a server's requests make them, cost no NVML call.
WATCH_AFTER_S = backstop_plan.GPU_SETTLE_S - 2 * PERIOD_S


class Backstop:
    """Locks gate-held tasks after a delay (or has them stopped with signals); unlocks them
    before they resume.

    It reads the tasks of ``registry`` (the facts its rules decide on, backstop_plan.py),
    takes the locks the executor asks for and writes what they did to ``events``;
    ``lock_available``: whether this machine's driver offers the lock (without a ``driver``
    given, the lock is not used where it does not); ``signals``: whether the executor may stop
    tasks with signals in its place. ``wake_fd`` is written to when a lock call finishes, to
    wake the daemon's loop, which then calls :meth:`collect`. ``meter`` measures held tasks'
    CPU time (hold_meter.py).
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
        signals: bool = False,
        meter: HoldMeter | None = None,
        gpu_busy: GpuBusy | None = None,
        watching: Watching | None = None,
    ) -> None:
        self.registry = registry
        self.events = events
        self.lock_available = lock_available
        self.delay_s = delay_ms / 1e3
        self._driver = driver
        self._wake_fd = wake_fd
        self.signals = signals
        self.meter = meter or HoldMeter()
        #: NVML's samples of the GPUs of tasks held outright (None: not read).
        self.gpu_busy = gpu_busy
        #: The blocks (task id, connection) a connection's gate watches (its peer's list).
        self.watching: Watching = watching or (lambda conn: ())
        #: The daemon time of the last :meth:`plan`: a task's GPUs whose watch was due after
        #: it are watched at the next.
        self._planned_at = float("-inf")
        #: Tasks a helper thread is locking now (a locked task has ``backstop_locked`` set).
        self._locking: set[int] = set()
        #: Tasks resumed while their lock was still being taken: unlock when it is.
        self._cancelled: set[int] = set()
        #: Tasks the backstop could not stop during this suspension: not tried again until then.
        self._failed: set[int] = set()
        #: Of those, the ones whose driver lock failed: signals may take its place.
        self._lock_failed: set[int] = set()
        #: Tasks the driver refuses to lock for good (CUDA_ERROR_NOT_SUPPORTED: a tools library
        #: is loaded in the process, the driver-level gate's): not tried again; signals stand
        #: in for the lock where they may be used, once it would have been due.
        self._lock_refused: set[int] = set()
        #: (task id, pid, call ms, error, refused for good) of finished lock calls, from the
        #: helper threads.
        self._done: queue.SimpleQueue[tuple[int, int, float, str | None, bool]] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []

    @property
    def can_lock(self) -> bool:
        return self.delay_s > 0 and (self._driver is not None or self.lock_available)

    @property
    def enabled(self) -> bool:
        """Whether anything backs a gate up: the lock, else signals (``--backstop-ms 0``:
        nothing)."""
        return self.can_lock or (self.delay_s > 0 and self.signals)

    @property
    def driver(self) -> CheckpointDriver:
        return self._driver if self._driver is not None else CheckpointDriver.get()

    def facts(self, full: dict[int, CpuWindow] | None = None) -> tuple[HoldFacts, ...]:
        """Every task as the backstop's rules read it (backstop_plan.py); ``full``: the
        holding windows the meter filled, by task id."""
        windows = full or {}
        to_unix = time.time() - time.monotonic()  # daemon time is monotonic
        return tuple(
            self._facts(task, windows.get(task.task_id), to_unix)
            for task in self.registry.tasks.values()
        )

    def _facts(self, task: Task, window: CpuWindow | None, to_unix: float) -> HoldFacts:
        """``task`` as the rules read it, with what this backstop tried on it."""
        gate_holds = task.suspended and kind(task.suspended_with).in_process
        launches = task.driver_launches  # read before the watched words: held_by_watch
        watch_held, watch_epochs = held_by_watch(task, self.registry.tasks, self.watching)
        return HoldFacts(
            task_id=task.task_id,
            uid=task.uid,
            priority=task.priority,
            gpus=task.gpus,
            held=task.held,
            backed_up=kind(task.mechanism).backed_up,
            gate_held_since=task.preempted_since if gate_holds else None,
            held_on_gpu=task.held_on_gpu,
            lock_tried=task.backstop_locked
            or task.task_id in self._locking
            or task.task_id in self._failed,
            counts_launches=task.driver_gate == "on",
            launches=launches,
            channels=len(task.controls),
            must_stand_still=self._must_stand_still(task),
            hold_baseline=task.hold_baseline,
            hold_leaked=task.hold_leaked,
            closes_gate=kind(task.mechanism).closes_gate,
            untrusted=task.gate_untrusted,
            signalled=task.backstop_signalled,
            lock_failed=task.task_id in self._lock_failed,
            lock_refused=task.task_id in self._lock_refused,
            cpu_counted=self.meter.counted(task),
            cpu_window=window,
            gpu_busy=self._gpu_busy(task, to_unix),
            barrier_leaked=any(c.barrier_leaks for c in task.controls.values()),
            watch_held=watch_held,
            watch_epochs=watch_epochs,
        )

    def _gpu_busy(self, task: Task, to_unix: float) -> bool:
        """Whether NVML saw ``task``'s processes on the SMs once its gate had held it outright
        for :data:`~.backstop_plan.GPU_SETTLE_S` (``to_unix``: unix time less daemon time)."""
        since = task.preempted_since
        if self.gpu_busy is None or since is None or not self._must_stand_still(task):
            return False
        settled = to_unix + since + backstop_plan.GPU_SETTLE_S
        return self.gpu_busy.busy_after(self.meter.processes(task), settled)

    def plan(self, now: float) -> BackstopPlan:
        """What the backstop does now: the holds to check (its meter looks at every task
        first), the tasks to lock or stop with signals."""
        self.meter.look(self.registry.tasks.values(), now)
        facts = self.facts(self.meter.take_full())
        self._planned_at = now
        if self.gpu_busy is not None:
            held = [f for f in self._to_watch(facts) if now >= f.gate_held_since + WATCH_AFTER_S]
            self.gpu_busy.watch({gpu for f in held for gpu in f.gpus})
        return backstop_plan.plan_backstop(
            facts,
            now,
            delay_s=self.delay_s,
            lock=self.can_lock,
            signals=self.enabled and self.signals,
        )

    def next_due(self, now: float | None = None) -> float | None:
        """Daemon time (monotonic) at which a task next needs its backup, a check, or its GPUs
        watched (:data:`WATCH_AFTER_S`), if any."""
        now = time.monotonic() if now is None else now
        facts = self.facts()
        due = backstop_plan.next_due(
            facts,
            now,
            delay_s=self.delay_s,
            lock=self.can_lock,
            signals=self.enabled and self.signals,
        )
        if self.gpu_busy is not None:  # those the last plan watched already are not due again
            starts = [f.gate_held_since + WATCH_AFTER_S for f in self._to_watch(facts)]
            starts = [t for t in starts if t > self._planned_at]
            due = min(starts + ([] if due is None else [due]), default=None)
        return due

    @staticmethod
    def _to_watch(facts: tuple[HoldFacts, ...]) -> list[HoldFacts]:
        """The tasks whose GPUs NVML is to watch once held long enough: held outright by a
        gate that stops every launch on the CPU."""
        return [f for f in facts if f.gate_held_since is not None and f.must_stand_still]

    @staticmethod
    def _must_stand_still(task: Task) -> bool:
        """Whether its gate stops every launch on the CPU now: the word of one of its gates
        is closed outright (odd). A gate closed only while watched tasks are active (2V)
        goes on by itself once none is, and while one is, its barriers hold the work on the
        GPU and the CPU may queue on behind them (docs/gate.md): its launches then prove
        nothing, but for a gate without barriers (:func:`held_by_watch`)."""
        return any(c.gate_word % 2 == 1 for c in task.controls.values())

    def why(self, task: Task) -> str:
        """Why ``task`` is backed up, for its ``backstop`` event."""
        if task.gate_untrusted:
            return "its gate was found not to hold"
        if task.task_id in self._lock_refused:
            return "the driver refuses to lock it"
        if task.task_id in self._lock_failed:
            return "its driver lock failed"
        return f"held by its gate for {self.delay_s * 1e3:g} ms"

    def lock(self, task: Task) -> None:
        """Start locking ``task`` in the driver, on a helper thread (its stop recorded first:
        persist.py); :meth:`collect` takes the outcome in."""
        self._locking.add(task.task_id)
        thread = threading.Thread(target=self._lock, args=(task.task_id, task.pid), daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def not_recorded(self, task: Task) -> None:
        """``task``'s lock or signals could not be recorded first (nobody could lift them
        after a crash), or its signals failed: nothing is tried again this suspension."""
        self._failed.add(task.task_id)
        self._lock_failed.discard(task.task_id)

    def _lock(self, task_id: int, pid: int) -> None:
        start = time.perf_counter()
        error, refused = None, False
        try:
            if self.driver.state(pid) != ProcessState.LOCKED:
                self.driver.lock(pid, LOCK_TIMEOUT_MS)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the loop must hear of it
            error = str(exc) if isinstance(exc, GpreemptError) else repr(exc)
            refused = isinstance(exc, CudaDriverError) and exc.code == NOT_SUPPORTED
        self._done.put((task_id, pid, (time.perf_counter() - start) * 1e3, error, refused))
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
                task_id, pid, latency_ms, error, refused = self._done.get_nowait()
            except queue.Empty:
                return locked
            task = self.registry.tasks.get(task_id)
            cancelled = task_id in self._cancelled or task is None or not task.suspended
            self._cancelled.discard(task_id)
            self._locking.discard(task_id)
            if error is not None:
                if task is not None:
                    self._failed.add(task_id)
                    self._lock_failed.add(task_id)  # signals may take its place
                    if refused:  # kept for the tasks still registered only
                        self._lock_refused = {
                            t for t in self._lock_refused if t in self.registry.tasks
                        } | {task_id}
                        error += "; not tried again on this task"
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
                    reason=self.why(task),
                )

    def finish(self) -> None:
        """Wait for the lock calls under way and lift the locks of tasks that resumed."""
        for thread in self._threads:
            thread.join()
        self._threads = []
        self.collect()

    def release(self, task: Task, now: float | None = None) -> None:
        """Before ``task`` resumes (at daemon time ``now``): count its hold, lift its lock, or
        have it lifted once it is taken (its signals are the executor's to undo)."""
        self.meter.close(task, time.monotonic() if now is None else now)
        task.hold_baseline = None
        task.hold_leaked = False
        self._failed.discard(task.task_id)
        self._lock_failed.discard(task.task_id)
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
