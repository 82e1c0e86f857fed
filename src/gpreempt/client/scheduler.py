"""Several tasks in one process, each in its own thread with its own priority and CUDA stream.

``GPUScheduler`` applies the daemon's policies (``hpf``, ``timeslice``) between threads of
one process, through the same launch gate: each task has a word in shared memory, its threads
wait before their next launch while the word is set, and only a bounded amount of a
preempted task's work stays in flight. Stream priority is used where it helps: the most
important tasks get the highest-priority CUDA streams.

    sched = gpreempt.GPUScheduler()
    sched.register_task("case-a", serve_one_request, priority="high", time_slice_ms=80)
    sched.register_task("case-b", train_one_step, priority="low", time_slice_ms=20)
    sched.run(duration_s=60)

A task is active from its first call to its last (``active_during_call=True``, the default:
a loop of training steps) or, for servers whose function also waits for work, only inside
``gpreempt.request()`` scopes entered by its threads (``active_during_call=False``).
Threads that already exist join with ``with sched.task("name", priority=...)``.

Threads bound to no task, PyTorch's autograd workers among them, follow the least important
task's word: the backward pass of a preempted training task waits with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..names import PolicyName
from ..policy import Snapshot, TaskView, get_policy
from ..policy.loop import LoopState, credit_run_time, run_pass
from ..priority import parse_priority

MAX_TASKS = 64
_current_task = threading.local()


@dataclass
class SchedTask:
    """One task of a :class:`GPUScheduler`."""

    task_id: int
    name: str
    priority: int
    func: Callable[[], Any] | None
    time_slice_ms: float | None
    active_during_call: bool
    word_address: int
    stream: Any = None
    requests: int = 0
    calls: int = 0
    suspended: bool = False
    run_seconds: float = 0.0
    suspended_seconds: float = 0.0
    thread: threading.Thread | None = None
    error: BaseException | None = field(default=None, repr=False)
    scheduler: Any = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.requests > 0


def current_task() -> SchedTask | None:
    """The scheduler task the calling thread is bound to, if any."""
    return getattr(_current_task, "task", None)


def task_scheduler(task: SchedTask) -> GPUScheduler:
    return task.scheduler


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


class GPUScheduler:
    """Priority scheduling between threads of one process (see the module docstring)."""

    def __init__(self, policy: str = PolicyName.HPF, *, gate: Any = None) -> None:
        self._policy = get_policy(policy)  # a UsageError that lists them for an unknown one
        #: What the last scheduling pass handed the next (policy/loop.py).
        self._loop = LoopState()
        self._words = mmap.mmap(-1, 4 * MAX_TASKS)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._words))
        self._tasks: dict[str, SchedTask] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._gate = gate
        self._gate_lock = threading.Lock()
        self._own_control: Any = None
        self._last_account = time.monotonic()
        self._wake_at: float | None = None
        self._timer: threading.Thread | None = None

    # ------------------------------------------------------------------ setup
    def register_task(
        self,
        name: str,
        func: Callable[[], Any] | None,
        priority: str | int = "normal",
        time_slice_ms: float | None = None,
        *,
        active_during_call: bool = True,
    ) -> SchedTask:
        """Add a task. ``run()`` calls ``func()`` in a thread of its own until it returns
        False or the scheduler stops. ``time_slice_ms`` is the task's turn under the
        ``timeslice`` policy."""
        with self._lock:
            if name in self._tasks:
                raise UsageError(f"a task named {name!r} is already registered")
            if len(self._tasks) >= MAX_TASKS:
                raise UsageError(f"at most {MAX_TASKS} tasks per scheduler")
            if time_slice_ms is not None and not time_slice_ms > 0:
                raise UsageError(f"time_slice_ms must be > 0, got {time_slice_ms}")
            task_id = len(self._tasks)
            task = SchedTask(
                task_id=task_id,
                name=name,
                priority=parse_priority(priority),
                func=func,
                time_slice_ms=time_slice_ms,
                active_during_call=active_during_call,
                word_address=self._base + 4 * task_id,
                scheduler=self,
            )
            self._tasks[name] = task
        self._ensure_gate()
        self._gate.set_default_task_word(self._lowest().word_address)
        return task

    def _lowest(self) -> SchedTask:
        return min(self._tasks.values(), key=lambda t: (t.priority, -t.task_id))

    def _ensure_gate(self) -> None:
        with self._gate_lock:
            if self._gate is not None:
                return
            from ..control_block import ControlBlock
            from .gate import current_gate, install_gate, resolve_config

            gate = current_gate()
            if gate is None:
                # Not under gpreempt run: a private control block that no daemon ever closes.
                self._own_control = ControlBlock.create()
                config = resolve_config(bound=True, auto_activity=False)
                gate = install_gate(self._own_control, config)
            self._gate = gate

    def _stream_for(self, task: SchedTask) -> Any:
        """A CUDA stream per task; the most important tasks get the highest stream priority."""
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        top = max(t.priority for t in self._tasks.values())
        _low, high = torch.cuda.Stream.priority_range()
        return torch.cuda.Stream(priority=high if task.priority == top else 0)

    # ------------------------------------------------------------------ threads
    @contextlib.contextmanager
    def task(
        self, name: str, priority: str | int = "normal", time_slice_ms: float | None = None
    ) -> Iterator[SchedTask]:
        """Bind the calling thread to a task (registered now if new) for the block's duration.

        Activity then comes from ``gpreempt.request()`` scopes in the thread.
        """
        task = self._tasks.get(name) or self.register_task(
            name, None, priority, time_slice_ms, active_during_call=False
        )
        with self._bound(task):
            yield task

    @contextlib.contextmanager
    def _bound(self, task: SchedTask) -> Iterator[None]:
        top = max(t.priority for t in self._tasks.values())
        self._gate.bind_thread(task.word_address, task.priority == top)
        previous = current_task()
        _current_task.task = task
        if task.stream is None:
            task.stream = self._stream_for(task)
        try:
            if task.stream is not None:
                import torch

                with torch.cuda.stream(task.stream):
                    yield
            else:
                yield
        finally:
            _current_task.task = previous
            self._gate.bind_thread(previous.word_address if previous else 0, False)

    @contextlib.contextmanager
    def active(self, task: SchedTask | None = None) -> Iterator[None]:
        """Mark a task (default: the calling thread's) active for the block."""
        task = task or current_task()
        if task is None:
            yield
            return
        self._enter(task)
        try:
            yield
        finally:
            self._exit(task)

    def _enter(self, task: SchedTask) -> None:
        with self._lock:
            self._account(time.monotonic())
            task.requests += 1
            if task.requests == 1:
                self._reschedule()

    def _exit(self, task: SchedTask) -> None:
        with self._lock:
            self._account(time.monotonic())
            task.requests -= 1
            if task.requests == 0:
                self._reschedule()

    # ------------------------------------------------------------------ policy
    def _account(self, now: float) -> None:
        """Count the time suspended since the last call (the policy's run time is counted by
        each scheduling pass)."""
        elapsed = now - self._last_account
        self._last_account = now
        for task in self._tasks.values():
            if task.suspended:
                task.suspended_seconds += elapsed

    def _snapshot(self, now: float) -> Snapshot:
        """The tasks as the policy sees them, with their run time as of the last pass."""
        return Snapshot(
            now=now,
            tasks=tuple(
                TaskView(
                    task_id=t.task_id,
                    priority=t.priority,
                    gpus=(0,),
                    active=t.active,
                    suspended=t.suspended,
                    timeslice_ms=t.time_slice_ms,
                    run_seconds=t.run_seconds,
                )
                for t in self._tasks.values()
            ),
        )

    def _reschedule(self) -> None:
        """Run a scheduling pass (lock held) and set the word of each task it changes."""
        now = time.monotonic()
        self._account(now)
        step = run_pass(self._policy, self._loop, self._snapshot(now))
        self._loop = step.state
        by_id = {t.task_id: t for t in self._tasks.values()}
        for task_id, run_seconds in step.run_seconds().items():
            by_id[task_id].run_seconds = run_seconds
        for task_id in step.suspend | step.resume:
            task = by_id[task_id]
            task.suspended = task_id in step.suspend
            ctypes.c_uint32.from_address(task.word_address).value = 1 if task.suspended else 0
        self._wake_at = step.wake_at
        self._changed.notify_all()

    def _timer_loop(self) -> None:
        """Re-ask time-based policies when their turn ends."""
        with self._lock:
            while not self._stop.is_set():
                timeout = None if self._wake_at is None else self._wake_at - time.monotonic()
                if timeout is not None and timeout <= 0:
                    self._reschedule()
                    continue
                self._changed.wait(timeout=0.5 if timeout is None else min(timeout, 0.5))

    # ------------------------------------------------------------------ running
    def _worker(self, task: SchedTask) -> None:
        assert task.func is not None
        with self._bound(task), self.active(task) if task.active_during_call else _nothing():
            while not self._stop.is_set():
                try:
                    result = task.func()
                except BaseException as exc:  # reported by run()
                    task.error = exc
                    self._stop.set()
                    return
                task.calls += 1
                if result is False:
                    return

    def run(self, duration_s: float | None = None) -> dict[str, dict[str, Any]]:
        """Run every registered task's function in its own thread; return per-task statistics.

        Stops after ``duration_s`` (if given), when every function returned False, or on
        :meth:`stop`. Re-raises the first exception a task raised.
        """
        workers = [t for t in self._tasks.values() if t.func is not None]
        if not workers:
            raise UsageError("no task with a function to run: register_task(name, func, ...)")
        self._stop.clear()
        self._timer = threading.Thread(target=self._timer_loop, name="gpreempt-sched", daemon=True)
        self._timer.start()
        for task in workers:
            task.thread = threading.Thread(
                target=self._worker, args=(task,), name=f"gpreempt-{task.name}", daemon=True
            )
            task.thread.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while any(t.thread.is_alive() for t in workers if t.thread):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if self._stop.wait(0.05):
                    break
        finally:
            self.stop()
            for task in workers:
                if task.thread:
                    task.thread.join()
        for task in workers:
            if task.error is not None:
                raise task.error
        return self.stats()

    def stop(self) -> None:
        """Stop the threads after their current call, and let every task run again."""
        self._stop.set()
        with self._lock:
            for task in self._tasks.values():
                task.suspended = False
                ctypes.c_uint32.from_address(task.word_address).value = 0
            self._changed.notify_all()

    def stats(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            now = time.monotonic()
            self._account(now)
            run = {
                view.task_id: view.run_seconds
                for view in credit_run_time(self._loop, self._snapshot(now)).tasks
            }
            return {
                t.name: {
                    "priority": t.priority,
                    "calls": t.calls,
                    "run_seconds": round(run[t.task_id], 6),
                    "suspended_seconds": round(t.suspended_seconds, 6),
                    "suspended": t.suspended,
                }
                for t in self._tasks.values()
            }

    def close(self) -> None:
        """Stop, unbind the default word, and release the gate the scheduler installed."""
        self.stop()
        if self._gate is not None:
            self._gate.set_default_task_word(0)
            if self._own_control is not None:
                self._gate.uninstall()
                self._own_control.close()
                self._own_control = None
