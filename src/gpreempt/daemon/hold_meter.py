"""How long each task was held by its gate, and how much CPU its processes used meanwhile, as
the kernel counts it: the evidence of a hold that no client can write.

A gate is code in the task's own process: the daemon writes the gate word, and whether the
process honours it is the client's word. The launches its driver-level gates count are the
client's word too (a liar freezes them). The CPU time of its processes is not: the kernel
counts it (:func:`~gpreempt.procinfo.cpu_time_ns`, the process's CPU-time clock). A gate closed
outright blocks every thread that launches, so a held process that keeps running is not held.

A task's CPU time is measured while every gate word of it is closed outright (odd: its held
threads sleep on the word, woken at most every millisecond) and its gates claim no stream
barriers. A word closed only while watched tasks are active (2V) is polled every 30 us by each
held thread, which costs a core a fifth of its time or more, and is written only below tasks
of the task's own user (watch lists never cross users). With barriers (``barriers_on``, or a
driver-level gate ``on``, which puts them and whose launch count is checked instead), a thread
that waits for its held work may spin on the CPU. Its holds (for a more important task, by
hand, for a peer's turn) add up into windows of :data:`~.backstop_plan.HOLD_WINDOW_S`; each
full window is judged by backstop_plan.py (:func:`~.backstop_plan.cpu_ran`).

The evidence is coarse: it finds a liar that spends its CPU, not one whose GPU work goes on at a
small cost on the CPU, nor one that claims barriers; and an honest process whose other threads
keep a fifth of a core busy while it is held looks like a liar (only the task itself then
pays: it is backed up with the driver lock or signals). docs/robustness.md states the bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..mechanisms import kind
from ..procinfo import cpu_time_ns
from .backstop_plan import HOLD_WINDOW_S, CpuWindow
from .task import Task


@dataclass
class _Window:
    """One task's holding time and its processes' CPU time in it, since its last window."""

    held_s: float = 0.0
    #: CPU time (s) each process used while held.
    cpu_s: dict[int, float] = field(default_factory=dict)
    #: Holds that started in it.
    holds: int = 0
    #: Daemon time of the last look while held (None: not held then), and each process's
    #: CPU time (ns) at that look.
    since: float | None = None
    cpu_then: dict[int, int] = field(default_factory=dict)


class HoldMeter:
    """Measures held tasks' CPU time, look after look (module docstring).

    ``processes``: the pids of a task's processes that hold its gates (the ones with a
    channel; by default the task's own pid); ``cpu_ns``: a process's CPU time (tests pass a
    fake).
    """

    def __init__(
        self,
        processes: Callable[[Task], list[int]] | None = None,
        cpu_ns: Callable[[int], int | None] = cpu_time_ns,
    ) -> None:
        self._processes = processes or (lambda task: [task.pid])
        self._cpu_ns = cpu_ns
        self._windows: dict[int, _Window] = {}
        #: Windows filled since they were last taken, by task id.
        self._full: dict[int, CpuWindow] = {}

    def processes(self, task: Task) -> list[int]:
        """The pids of ``task``'s processes that hold its gates."""
        return self._processes(task)

    @staticmethod
    def counted(task: Task) -> bool:
        """Whether ``task``'s CPU time counts as held now: its gate holds it (for anything,
        a peer's turn included) with every word closed outright and no barriers claimed, no
        hold of it leaked, and neither the driver lock nor signals hold it already."""
        return (
            task.suspended
            and kind(task.suspended_with).in_process
            and bool(task.controls)
            and not task.hold_leaked
            and not task.gate_untrusted
            and not task.barriers_on
            and task.driver_gate != "on"
            and not task.backstop_locked
            and not task.backstop_signalled
            and all(c.gate_word % 2 == 1 for c in task.controls.values())
        )

    def look(self, tasks: Iterable[Task], now: float) -> None:
        """Count each task's time since the last look, held or not, and go on measuring the
        ones held now; forget the tasks that are gone."""
        present = set()
        for task in tasks:
            present.add(task.task_id)
            window = self._windows.setdefault(task.task_id, _Window())
            was_held = window.since is not None
            readings = self._count(task.task_id, window, now)
            if self.counted(task):
                if not was_held:
                    window.holds += 1
                window.since = now
                window.cpu_then = {
                    pid: ns
                    for pid in self._processes(task)
                    if (ns := readings.get(pid, self._cpu_ns(pid))) is not None
                }
        for task_id in set(self._windows) - present:
            del self._windows[task_id]
            self._full.pop(task_id, None)

    def close(self, task: Task, now: float) -> None:
        """``task`` is about to resume: count its hold up to ``now``."""
        window = self._windows.get(task.task_id)
        if window is not None:
            self._count(task.task_id, window, now)

    def take_full(self) -> dict[int, CpuWindow]:
        """The windows filled since the last call, by task id (each is given once)."""
        full, self._full = self._full, {}
        return full

    def _count(self, task_id: int, window: _Window, now: float) -> dict[int, int]:
        """Add the time since the window's last look, if it was held then, and its processes'
        CPU time in it; a window that fills is set aside for the plan. Returns the CPU times
        read now (ns, by pid)."""
        if window.since is None:
            return {}
        readings: dict[int, int] = {}
        for pid, then in window.cpu_then.items():
            ns = self._cpu_ns(pid)
            if ns is None:
                continue  # gone: its channel closes, and the task with it
            readings[pid] = ns
            window.cpu_s[pid] = window.cpu_s.get(pid, 0.0) + max(0, ns - then) / 1e9
        window.held_s += max(0.0, now - window.since)
        window.since = None
        if window.held_s >= HOLD_WINDOW_S:
            self._full[task_id] = CpuWindow(
                held_s=window.held_s,
                holds=window.holds,
                cpu_s=tuple(sorted(window.cpu_s.items())),
            )
            window.held_s, window.cpu_s, window.holds = 0.0, {}, 0
        return readings
