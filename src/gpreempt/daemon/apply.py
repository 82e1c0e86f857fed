"""Carry out a :class:`~gpreempt.daemon.plan.Plan`: suspend and resume (the gates are told
the rest by apply_gates.py), and the backstop's plan (backstop_plan.py).

Everything here acts on the world (signals, driver calls, shared memory) and records what
happened (the task's counters, the event log, metrics); what to do was decided by
``daemon/plan.py`` and ``daemon/backstop_plan.py``. A suspension can fail: the task then shows
as ``unprotected`` until a suspension succeeds or the policy no longer wants it.

Record before acting: a stop that outlives the daemon (a signal, a driver lock, unmapped
queues) is written to the state file before it is made (persist.py), all of one pass's in
one write; a stop that cannot be recorded is not made (the task is ``unprotected``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..errors import GpreemptError, NoSuchProcess
from ..mechanisms import MechanismSet, kind
from ..mechanisms.base import Target
from ..names import MechanismName
from .backstop import Backstop
from .backstop_plan import GPU_SETTLE_S, BackstopPlan, HoldLeak
from .event_log import EventLog
from .identity import GroupCensus, OwnerAuthority
from .plan import Plan
from .registry import Registry
from .task import Task
from .task_state import StateLog, TaskState


class Host(Protocol):
    """What the executor uses of the daemon: its tasks, mechanisms and state files."""

    registry: Registry
    mechanisms: MechanismSet
    events: EventLog
    backstop: Backstop
    metrics: Any
    census: GroupCensus
    log: Callable[[str], None]

    def record_stops(self, about_to: dict[int, str]) -> bool: ...
    def state_files_error(self) -> str | None: ...


class Executor:
    """Applies plans to the daemon's tasks (one thread: the daemon's loop)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        #: Tasks (by id) whose coming stop is recorded, with the mechanism recorded.
        self._recorded: dict[int, str] = {}
        #: Signals go to a task's group with its owner's authority (identity.py).
        self.authority = OwnerAuthority()

    @property
    def states(self) -> StateLog:
        """How a task's state changes, and is told (the metrics may be set after start)."""
        return StateLog(self.host.events, self.host.metrics)

    # ------------------------------------------------------------------ plans
    def credit_run_time(self, run_seconds: Mapping[int, float]) -> None:
        """Record the GPU time the scheduling loop credited each task with (by task id)."""
        tasks = self.host.registry.tasks
        for task_id, seconds in run_seconds.items():
            tasks[task_id].counters.run_seconds = seconds

    def apply_suspensions(self, plan: Plan, now: float) -> bool:
        """Suspend, then resume, as ``plan`` says; returns whether any task's state changed
        (what a successor daemon must know then changed too)."""
        tasks = self.host.registry.tasks
        changed = False
        # Suspend first: a more important task is waiting for these.
        self._record_first([tasks[s.task_id] for s in plan.suspend])
        for step in plan.suspend:
            reason = "turn" if step.turn else None
            changed |= self.suspend(tasks[step.task_id], reason, now=now, fallback=step.fallback)
        # a suspended task waits either for its turn or for a more important task
        for wait in plan.wait_changes:
            wanted = TaskState.WAITING_TURN if wait.turn else TaskState.SUSPENDED
            self.states.settled(tasks[wait.task_id], wanted, now=now)
        for task_id in plan.protected_again:
            self.states.protected_again(tasks[task_id], now=now)
            changed = True
        for task_id in plan.resume:
            changed |= self.resume(tasks[task_id], reason="policy")
        self._recorded.clear()
        return changed

    def _record_first(self, tasks: list[Task]) -> None:
        """Record, in one write, the tasks about to be stopped by a mechanism whose stop
        outlives the daemon (not their gate alone)."""
        about_to: dict[int, str] = {}
        for task in tasks:
            name = self._concrete(task)
            if name is not None and not kind(name).in_process:
                about_to[task.task_id] = name
        if about_to and self.host.record_stops(about_to):
            self._recorded = about_to

    def _concrete(self, task: Task) -> str | None:
        """The mechanism a suspension of ``task`` would use now (None: it cannot say)."""
        mechanism = self.host.mechanisms.get(task.mechanism)
        choose = getattr(mechanism, "choose", None)
        try:
            return str(choose(task.target(False)).name if choose else mechanism.name)
        except GpreemptError:
            return None

    def _recorded_first(self, task: Task, name: str) -> bool:
        """Whether a stop of ``task`` by ``name`` is recorded, recording it now if not
        (a mechanism kept in the process needs no record)."""
        if kind(name).in_process or self._recorded.get(task.task_id) == name:
            return True
        if self.host.record_stops({task.task_id: name}):
            self._recorded[task.task_id] = name
            return True
        return False

    def apply_backstop(self, plan: BackstopPlan) -> None:
        """Carry out the backstop's plan (backstop_plan.py): note each hold's baseline, report
        each hold that leaks (its gate no longer trusted), and lock the tasks it names, or stop
        them with signals, each recorded first."""
        tasks = self.host.registry.tasks
        for baseline in plan.baselines:
            tasks[baseline.task_id].hold_baseline = baseline
        for leak in plan.leaks:
            task = tasks[leak.task_id]
            task.hold_leaked = True
            task.gate_untrusted = True
            task.counters.hold_leaks += 1
            self.host.events.write(
                "error",
                **task.event_fields(),
                mechanism=task.suspended_with,
                reason=f"its suspension does not hold: {_evidence(leak)}; {_fallback(leak, task)}",
            )
        for task_id in plan.locks:
            task = tasks[task_id]
            if self.host.record_stops({task_id: MechanismName.LOCK}):
                self.host.backstop.lock(task)
            else:
                self.host.backstop.not_recorded(task)
        for task_id in plan.signals:
            self._stop_behind_gate(tasks[task_id])

    def _stop_behind_gate(self, task: Task) -> None:
        """Stop ``task`` with signals behind its closed gate (recorded first); the backstop
        tries nothing more on it this suspension if that fails."""
        backstop = self.host.backstop
        if not self.host.record_stops({task.task_id: MechanismName.SIGNAL}):
            backstop.not_recorded(task)
            return
        start = time.perf_counter()
        try:
            self.signal(task, stop=True)
        except NoSuchProcess:
            return
        except GpreemptError as exc:
            backstop.not_recorded(task)
            self.host.events.write(
                "error",
                **task.event_fields(),
                mechanism=MechanismName.SIGNAL,
                reason=f"backstop signal failed: {exc}",
            )
            return
        task.backstop_signalled = True
        self.host.events.write(
            "backstop",
            **task.event_fields(),
            mechanism=MechanismName.SIGNAL,
            latency_ms=(time.perf_counter() - start) * 1e3,
            reason=backstop.why(task),
        )

    def signal(self, task: Task, *, stop: bool) -> None:
        """Stop (``stop``) or continue ``task`` with signals, as mechanism ``signal`` does, with
        its owner's authority where it can. Raises NoSuchProcess once it is gone,
        GpreemptError if it cannot be signalled."""
        mechanism = self.host.mechanisms.get(MechanismName.SIGNAL)
        with self._authority(task, MechanismName.SIGNAL):
            target = self.target(task, MechanismName.SIGNAL)
            if stop:
                mechanism.suspend(target)
            else:
                mechanism.resume(target)

    # ------------------------------------------------------------------ one task
    def suspend(
        self,
        task: Task,
        reason: str | None = None,
        *,
        now: float,
        fallback: str | None = None,
    ) -> bool:
        """Suspend ``task`` by its mechanism, else by ``fallback`` (the plan's); ``reason``
        for the event log (default: held or policy; ``turn``: only for a peer's turn);
        ``now``: the pass's daemon time. Returns whether its state changed."""
        mechanisms = self.host.mechanisms
        mechanism = mechanisms.get(task.mechanism)
        choose = getattr(mechanism, "choose", None)
        start = time.perf_counter()
        concrete = mechanism
        try:
            concrete = choose(task.target(False)) if choose is not None else mechanism
            if not self._recorded_first(task, concrete.name):
                return self._unrecorded(task, concrete.name, now)
            with self._authority(task, concrete.name):
                used = concrete.suspend(self.target(task, concrete.name))
        except NoSuchProcess:
            return False
        except GpreemptError as exc:
            if fallback is None:
                return self._suspend_failed(task, task.mechanism, exc, now)
            if not self._recorded_first(task, fallback):
                return self._unrecorded(task, fallback, now)
            try:
                with self._authority(task, fallback):
                    used = mechanisms.get(fallback).suspend(self.target(task, fallback))
            except NoSuchProcess:
                return False
            except GpreemptError as failed:
                return self._suspend_failed(task, fallback, failed, now)
        latency_ms = (time.perf_counter() - start) * 1e3
        degraded = mechanism.take_degradation(self.target(task, concrete.name))
        if degraded is not None:
            self._degraded(task, used, degraded)
        turn = reason == "turn"
        if turn:
            task.counters.turns += 1
        else:
            task.counters.preemptions += 1
        task.counters.last_suspend_ms = round(latency_ms, 4)
        self.states.suspended(
            task,
            turn=turn,
            mechanism=used,
            latency_ms=latency_ms,
            reason=reason or ("held" if task.held else "policy"),
            now=time.monotonic(),
        )
        return True

    def _unrecorded(self, task: Task, mechanism: str, now: float) -> bool:
        """A stop that could not be recorded first is not made (persist.py)."""
        error = self.host.state_files_error() or "the state file cannot be written"
        reason = GpreemptError(
            f"not stopped: {error}, and a daemon killed now would leave it stopped"
        )
        return self._suspend_failed(task, mechanism, reason, now)

    def _suspend_failed(self, task: Task, mechanism: str, exc: Exception, now: float) -> bool:
        """Record that the policy wants ``task`` suspended and ``mechanism`` failed: its state
        becomes ``unprotected`` (status, top, metrics) until a suspension succeeds or the
        policy no longer wants it. The event log gets one line per new reason, not one per
        retry. Returns whether the task's state changed."""
        reason = f"suspend failed: {exc}"
        if not self.states.unprotected(task, mechanism=mechanism, reason=reason, now=now):
            return False
        self.host.log(f"{task.name} (pid {task.pid}) is unprotected: {reason}")
        return True

    def _degraded(self, task: Task, used: str, reason: str) -> None:
        """Record that ``task``'s mechanism held less than it promises (kfd that suspended
        none of the task's queues, say) and ``used`` held it instead: an event, the task's
        counter, and a failure of its mechanism in the metrics."""
        task.counters.degradations += 1
        self.host.events.write(
            "degraded", **task.event_fields(), mechanism=task.mechanism, used=used, reason=reason
        )
        self.host.log(f"{task.name} (pid {task.pid}): {reason}")
        if self.host.metrics is not None:
            self.host.metrics.on_suspend_failed(task.gpu, task.name, task.mechanism)

    def resume(self, task: Task, reason: str) -> bool:
        """Resume ``task`` with the mechanism that suspended it; returns whether it did."""
        used = task.suspended_with or MechanismName.SIGNAL
        start = time.perf_counter()
        self.host.backstop.release(task)
        if task.backstop_signalled:  # its backstop's signals first, then its gate
            task.backstop_signalled = False
            try:
                self.signal(task, stop=False)
            except GpreemptError as exc:
                self.host.events.write(
                    "error",
                    **task.event_fields(),
                    mechanism=MechanismName.SIGNAL,
                    reason=f"backstop continue failed: {exc}",
                )
        try:
            with self._authority(task, used):
                self.host.mechanisms.concrete[used].resume(self.target(task, used))
        except NoSuchProcess:
            pass
        except GpreemptError as exc:
            self.host.events.write(
                "error",
                **task.event_fields(),
                mechanism=used,
                reason=f"resume failed: {exc}",
            )
            return False
        latency_ms = (time.perf_counter() - start) * 1e3
        task.counters.suspended_seconds += self.states.resumed(
            task, mechanism=used, latency_ms=latency_ms, reason=reason, now=time.monotonic()
        )
        return True

    def _authority(self, task: Task, mechanism: str) -> contextlib.AbstractContextManager[None]:
        """Where signals go to ``task``'s group: with its owner's authority (identity.py)."""
        if mechanism == MechanismName.SIGNAL and self.authority.usable(task.uid):
            return self.authority.acting_as(task.uid)
        return contextlib.nullcontext()

    def target(self, task: Task, mechanism: str | None = None) -> Target:
        """What ``mechanism`` acts on: the task's whole group where a root daemon signals it
        with its owner's authority (the kernel then spares what the owner could not stop),
        or where every member belongs to its owner (a root daemon could otherwise stop a
        root process in a user's job), else its process alone; signals go to the process
        that started at its start time."""
        pgid = task.identity.pgid
        whole = pgid is None or os.geteuid() != 0 or task.uid == 0
        whole = whole or (mechanism == MechanismName.SIGNAL and self.authority.usable(task.uid))
        if not whole:
            assert pgid is not None
            whole = self.host.census.owned_by(pgid, task.uid)
        return task.target(whole_group=whole)


def _evidence(leak: HoldLeak) -> str:
    """What gave a leaking hold away, for its event."""
    if leak.barrier:
        return (
            "its GPU work passed its stream barriers while a more important task stayed active "
            "(its driver-level gate's count)"
        )
    if leak.gpu:
        return (
            f"NVML saw its processes on the GPU's SMs {GPU_SETTLE_S:g} s or more after its gate "
            "closed"
        )
    if leak.ran is None:
        return f"{leak.moved} launches while its gate was closed"
    return (
        f"its process {leak.ran.pid} ran {leak.ran.seconds * 1e3:.0f} ms on the CPU in "
        f"{leak.ran.held_s * 1e3:.0f} ms while its gate was closed (the kernel's count)"
    )


def _fallback(leak: HoldLeak, task: Task) -> str:
    """What backs a leaking hold up now, for its event."""
    if leak.locked:
        return "the driver lock backs it up"
    if leak.signals:
        return "signals stop it (no driver lock for it here)"
    if task.preempted_since is None:  # it waited for a peer's turn
        return "its gate's words no longer count: it takes no turns"
    return "no driver lock here"
