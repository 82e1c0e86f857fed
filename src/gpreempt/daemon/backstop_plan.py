"""What the backstop does in a pass, as pure functions over frozen facts.

The rules are backstop.py's (its docstring says why): a task of mechanism ``auto`` held by its
gate for the delay is locked in the driver too, unless its gate holds it on the GPU and only
tasks of its own user outrank it there; where there is no lock, signals stop it instead, but
only below another user's task. A held task must stand still: the launches of a task whose
gate holds it outright must not move once it has been held a moment, and its processes may not
keep running on the CPU (:func:`cpu_ran`, over the windows hold_meter.py measures), nor be
seen on the GPU's SMs by NVML once held :data:`GPU_SETTLE_S` (gpu_busy.py), and the GPU may
not run a task's work past its stream barriers while a task it watches stays active (its
driver-level gate's count); else its hold leaks, its gate's words no longer count, and it is
locked (or signalled) at once.
:func:`plan_backstop` reads :class:`HoldFacts` and returns a frozen :class:`BackstopPlan`; the
executor (apply.py) carries it out, with backstop.py's lock calls. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..names import MechanismName

#: After this long held, a gated task's launches must stand still.
SETTLE_MS = 200.0
#: How often they are looked at, while it stays suspended.
CHECK_PERIOD_MS = 100.0
#: Launches a held process may still count per channel (a launch per thread it holds).
LEAK_SLACK = 16
#: Holding time over which a held process's CPU time is judged (s).
HOLD_WINDOW_S = 0.25
#: Share of the time held that a held process may still run on the CPU (of one core).
CPU_LEAK_SHARE = 0.2
#: CPU time a process may use at the start of each hold, finishing what it was doing (s).
CPU_GRACE_S = 0.002
#: After this long held outright, NVML may no longer see its processes on the SMs (s):
#: what they had queued has long completed, and no sampling period reaches back before the
#: hold (gpu_busy.py).
GPU_SETTLE_S = 2.0


@dataclass(frozen=True)
class CpuWindow:
    """A task's holding time, :data:`HOLD_WINDOW_S` or more, and the CPU time its processes
    used in it, as the kernel counts it (hold_meter.py)."""

    held_s: float
    #: Holds that started in it (each grants :data:`CPU_GRACE_S`).
    holds: int
    #: (pid, CPU seconds while held) of each of its processes.
    cpu_s: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class CpuRun:
    """What gave a hold away: process ``pid`` ran ``seconds`` on the CPU in ``held_s``."""

    pid: int
    seconds: float
    held_s: float


@dataclass(frozen=True)
class HoldBaseline:
    """Count ``task_id``'s launches from ``launches`` on (its hold is checked from the next
    look); ``epochs``: its watched blocks' activity epochs then, where they held it."""

    task_id: int
    launches: int
    epochs: tuple[int, ...] | None = None


@dataclass(frozen=True)
class HoldFacts:
    """What the backstop's rules read of one task."""

    task_id: int
    uid: int
    priority: int
    gpus: tuple[int, ...]
    #: Held by hand (``gpreempt suspend``): it outranks nobody meanwhile.
    held: bool
    #: Its mechanism is backed up by the driver lock (``auto``).
    backed_up: bool
    #: Since when its gate holds it for a more important task or by hand (daemon time);
    #: None while it is not held by its gate, or only waits for its turn among peers.
    gate_held_since: float | None
    #: Its gate holds on the GPU by itself (:attr:`~gpreempt.daemon.task.Task.held_on_gpu`).
    held_on_gpu: bool
    #: Locked behind its gate already, being locked, or its lock failed this suspension.
    lock_tried: bool
    #: Its driver-level gates are on and count its launches.
    counts_launches: bool
    #: The launches they counted, over its processes.
    launches: int
    #: Its processes with a channel (each may count a launch per thread it holds).
    channels: int
    #: One of its gate words is closed outright: its launches must stand still.
    must_stand_still: bool
    #: Its launches once its gate had held it a moment, this suspension, with the epochs of
    #: the blocks it watched where they held it (None: not yet).
    hold_baseline: HoldBaseline | None
    #: Its hold was found to leak, this suspension.
    hold_leaked: bool
    #: Its mechanism closes its gate (``gate`` or ``auto``): backed up once its gate was found
    #: not to hold, whatever its mechanism.
    closes_gate: bool = True
    #: A hold of it was found to leak: its gate's words no longer count.
    untrusted: bool = False
    #: Stopped with signals behind its gate already.
    signalled: bool = False
    #: Its driver lock failed this suspension: signals take its place where they may.
    lock_failed: bool = False
    #: The driver refuses to lock its processes for good (a tools library is loaded in them,
    #: the driver-level gate's): signals take the lock's place from the start, where they may.
    lock_refused: bool = False
    #: Its processes' CPU time is measured now (hold_meter.py).
    cpu_counted: bool = False
    #: Its holding window that filled since the last pass, if one did.
    cpu_window: CpuWindow | None = None
    #: NVML saw its processes on the SMs :data:`GPU_SETTLE_S` or more after its gate held it
    #: outright (gpu_busy.py).
    gpu_busy: bool = False
    #: Its driver-level gates saw its GPU work pass a stream barrier while a task they watch
    #: stayed active (driver_verify.cpp): its barriers do not hold.
    barrier_leaked: bool = False
    #: Every gate of it holds each launch on the CPU only while a task it watches is active,
    #: and one is now (watch_hold.py, ``held_by_watch``); the activity epochs of the blocks it
    #: watches now. Alike in its baseline, a watched task stayed active in between: its
    #: launches must stand still.
    watch_held: bool = False
    watch_epochs: tuple[int, ...] = ()


@dataclass(frozen=True)
class HoldLeak:
    """``task_id``'s work went on behind its closed gate: ``moved`` launches since its
    baseline, or its CPU time (``ran``); ``locked``: the driver lock backs it up, ``signals``:
    signals do (neither: this machine has no lock, or it only waited for a peer's turn)."""

    task_id: int
    moved: int
    locked: bool
    signals: bool = False
    ran: CpuRun | None = None
    #: NVML saw its processes on the SMs (gpu_busy.py).
    gpu: bool = False
    #: Its GPU work passed its stream barriers while a task it watches stayed active.
    barrier: bool = False


@dataclass(frozen=True)
class BackstopPlan:
    """What the backstop does in one pass, in this order."""

    baselines: tuple[HoldBaseline, ...]
    leaks: tuple[HoldLeak, ...]
    #: Tasks to lock in the driver behind their gate.
    locks: tuple[int, ...]
    #: Tasks to stop with signals behind their gate (no lock here, or it failed).
    signals: tuple[int, ...] = ()


def plan_backstop(
    tasks: Sequence[HoldFacts], now: float, *, delay_s: float, lock: bool, signals: bool = False
) -> BackstopPlan:
    """Check the holds; back up every task held by its gate for ``delay_s`` or longer (at once
    one whose hold leaks). ``lock``: whether the backstop may lock; ``signals``: whether it may
    stop tasks with signals (where it may not lock, or a lock failed)."""
    baselines: list[HoldBaseline] = []
    leaks: list[HoldLeak] = []
    backup = _backup(lock, signals)
    for task in tasks:
        preempted = task.gate_held_since is not None
        own = _backup_for(task, backup, signals)
        ran = cpu_ran(task.cpu_window) if task.cpu_window is not None else None
        if ran is not None and not task.hold_leaked and not task.untrusted:
            leaks.append(_leak(task, 0, own if preempted else None, ran))
            continue
        if task.gpu_busy and task.must_stand_still and not (task.hold_leaked or task.untrusted):
            leaks.append(_leak(task, 0, own if preempted else None, gpu=True))
            continue
        if task.barrier_leaked and not (task.hold_leaked or task.untrusted):
            leaks.append(_leak(task, 0, own if preempted else None, barrier=True))
            continue
        since = task.gate_held_since
        if not _checked(task) or since is None or now < since + SETTLE_MS / 1e3:
            continue
        baseline = task.hold_baseline
        held = task.must_stand_still or (
            task.watch_held and baseline is not None and task.watch_epochs == baseline.epochs
        )
        if baseline is None or not held:
            epochs = task.watch_epochs if task.watch_held else None
            baselines.append(HoldBaseline(task.task_id, task.launches, epochs))
            continue
        moved = task.launches - baseline.launches
        if moved > LEAK_SLACK * max(1, task.channels):
            leaks.append(_leak(task, moved, own))
    leaked = {leak.task_id for leak in leaks}
    locks: list[int] = []
    stops: list[int] = []
    for task in tasks:
        since = task.gate_held_since
        if since is None or task.signalled:
            continue
        if task.lock_failed and signals:
            stops.append(task.task_id)
            continue
        own = _backup_for(task, backup, signals)
        if backup is None or own is None or not _eligible(task, tasks, leaked, backup):
            continue
        if now >= _due(task, leaked, delay_s):
            (locks if own == _LOCK else stops).append(task.task_id)
    return BackstopPlan(
        baselines=tuple(baselines), leaks=tuple(leaks), locks=tuple(locks), signals=tuple(stops)
    )


def cpu_ran(window: CpuWindow) -> CpuRun | None:
    """The process that gave a held task away in ``window``, if one did: it ran on the CPU
    more than :data:`CPU_LEAK_SHARE` of the time held, less its holds' grace."""
    grace = window.holds * CPU_GRACE_S
    allowed = CPU_LEAK_SHARE * window.held_s
    ran = [(pid, s) for pid, s in window.cpu_s if s - grace > allowed]
    if not ran:
        return None
    pid, seconds = max(ran, key=lambda item: item[1])
    return CpuRun(pid, seconds, window.held_s)


def next_due(
    tasks: Sequence[HoldFacts], now: float, *, delay_s: float, lock: bool, signals: bool = False
) -> float | None:
    """Daemon time at which a task next needs its backup or a check of its hold, if any."""
    due = [
        max(t.gate_held_since + SETTLE_MS / 1e3, now + CHECK_PERIOD_MS / 1e3)
        if t.hold_baseline is not None
        else t.gate_held_since + SETTLE_MS / 1e3
        for t in tasks
        if _checked(t) and t.gate_held_since is not None
    ]
    due += [now + HOLD_WINDOW_S for t in tasks if t.cpu_counted]
    backup = _backup(lock, signals)
    if backup is not None:
        due += [
            _due(t, set(), delay_s)
            for t in tasks
            if t.gate_held_since is not None
            and not t.signalled
            and _backup_for(t, backup, signals) is not None
            and _eligible(t, tasks, set(), backup)
        ]
    return min(due) if due else None


_LOCK, _SIGNAL = MechanismName.LOCK, MechanismName.SIGNAL


def _backup(lock: bool, signals: bool) -> str | None:
    """What backs a gate up: the driver lock, else signals, else nothing."""
    return _LOCK if lock else (_SIGNAL if signals else None)


def _backup_for(task: HoldFacts, backup: str | None, signals: bool) -> str | None:
    """What backs ``task``'s gate up: ``backup``, but signals (or nothing, where they may not
    be used) in place of a lock the driver refuses it. It is the lock's rules that say when
    (:func:`_eligible` with ``backup``): signals stand in for it, they do not widen it."""
    if backup == _LOCK and task.lock_refused:
        return _SIGNAL if signals else None
    return backup


def _leak(
    task: HoldFacts,
    moved: int,
    backup: str | None,
    ran: CpuRun | None = None,
    *,
    gpu: bool = False,
    barrier: bool = False,
) -> HoldLeak:
    return HoldLeak(
        task.task_id,
        moved,
        locked=backup == _LOCK,
        signals=backup == _SIGNAL,
        ran=ran,
        gpu=gpu,
        barrier=barrier,
    )


def _due(task: HoldFacts, leaked: set[int], delay_s: float) -> float:
    """When an eligible task is backed up: at once if its hold leaked or its gate is not
    trusted, else once held ``delay_s``."""
    assert task.gate_held_since is not None
    at_once = task.hold_leaked or task.untrusted or task.task_id in leaked
    return task.gate_held_since + (0.0 if at_once else delay_s)


def _checked(task: HoldFacts) -> bool:
    """Whether the task's hold is checked now: its gate holds it, and it has a driver-level
    gate that counts its launches."""
    return task.gate_held_since is not None and not task.hold_leaked and task.counts_launches


def _eligible(task: HoldFacts, tasks: Sequence[HoldFacts], leaked: set[int], backup: str) -> bool:
    """Whether ``backup`` may back ``task``'s gate up (``leaked``: tasks found leaking now):
    any task whose gate is not trusted; else one of mechanism ``auto``, which the lock backs
    up unless its gate holds on the GPU and only its own user's tasks outrank it, and signals
    only below another user's task."""
    if task.gate_held_since is None or task.lock_tried:
        return False
    if task.untrusted or task.hold_leaked or task.task_id in leaked:
        return task.closes_gate
    if not task.backed_up:
        return False
    if backup == _LOCK:
        return not (task.held_on_gpu and not _for_another_user(task, tasks))
    return _for_another_user(task, tasks)


def _for_another_user(task: HoldFacts, tasks: Sequence[HoldFacts]) -> bool:
    """Whether a more important task of another user shares a GPU with ``task``: its
    gate's own words (barriers on, driver-level gate on) then do not spare it the lock.
    What a client writes in its block may only hurt its own user: a task that claims a
    gate it does not have is locked like any other once the delay has passed."""
    return any(
        other.uid != task.uid
        and other.priority > task.priority
        and not other.held
        and set(other.gpus) & set(task.gpus)
        for other in tasks
    )
