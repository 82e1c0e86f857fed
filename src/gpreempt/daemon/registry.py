"""The daemon's tasks: what it knows of each registered process."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import NoSuchTask
from ..field_checks import MAX_GPUS
from ..mechanisms import kind
from ..mechanisms.base import Target
from ..policy import Snapshot, TaskView
from ..priority import priority_name
from .task_state import STOPPED, TaskState

if TYPE_CHECKING:
    from ..control_block import ControlBlock


@dataclass
class Task:
    """One registered process and its counters. Mutated only by the daemon's loop."""

    task_id: int
    pid: int
    #: Process group to signal (set for tasks ``gpreempt run`` started in their own group).
    pgid: int | None
    start_time: int
    uid: int
    name: str
    priority: int
    gpus: tuple[int, ...]
    #: Mechanism asked for: auto, gate, lock or signal.
    mechanism: str
    always_active: bool = False
    timeslice_ms: float | None = None
    min_share: float | None = None
    #: Bytes of free GPU memory this task needs while active (memory preemption).
    reserve_bytes: int = 0
    #: Id of the connection whose closing ends the task (its launcher), if any.
    owner: int | None = None
    #: Control blocks of in-process clients, keyed by connection id.
    controls: dict[int, ControlBlock] = field(default_factory=dict)
    #: GPUs its ranks added (not among those it registered with), by connection id.
    rank_gpus: dict[int, int] = field(default_factory=dict)
    #: Where it stands with the GPU; changed only by task_state.change_state.
    state: TaskState = TaskState.RUNNING
    #: Concrete mechanism that suspended it (resume with the same one); the last one, once
    #: it runs again.
    suspended_with: str | None = None
    suspended_since: float | None = None
    #: Since when it is suspended for a reason other than waiting for its turn among peers
    #: (a more important task, or held); None while it runs or only waits for its turn.
    preempted_since: float | None = None
    #: An operator holds it suspended (``gpreempt suspend``), whatever the policy says.
    held: bool = False
    evicted_bytes: int = 0
    #: Unlock right after restoring (the eviction's lock was not how the policy suspended it).
    evict_unlock: bool = False
    preemptions: int = 0
    #: Times it was stopped to wait for its turn among peers (not counted in ``preemptions``).
    turns: int = 0
    #: Suspensions its mechanism held only in part, another one holding it (event ``degraded``).
    degradations: int = 0
    suspended_seconds: float = 0.0
    last_suspend_ms: float | None = None
    run_seconds: float = 0.0
    #: Activity as last observed by the daemon (events and policies use this one value).
    was_active: bool = False
    #: Also locked in the driver, behind its closed gate (mechanism auto; see backstop.py).
    backstop_locked: bool = False
    #: GPU time (ms) its gate may keep in flight, as last written to its control blocks.
    window_share_ms: float | None = None
    #: Daemon time it was last seen wanting the GPU (None: never).
    last_active: float | None = None
    #: Its gate may sleep, as last written to its control blocks (policy/sleep.py).
    sleep_ok: bool = False
    #: Why the policy's last suspension of it failed, while the policy still wants it
    #: suspended (state ``unprotected``); None otherwise.
    suspend_error: str | None = None
    #: Launches its driver-level gates had seen once its gate had held it a moment, this
    #: suspension (backstop.py checks that they stand still); None before.
    hold_baseline: int | None = None
    #: Its GPU work went on while its gate was closed, this suspension (backstop.py).
    hold_leaked: bool = False
    #: Suspensions whose hold was found to leak, since it registered.
    hold_leaks: int = 0
    #: Registered with ``attach`` (by pid, not owned by a connection): a restarted daemon
    #: registers it again from its persisted state.
    attached: bool = False
    #: A pidfd of its process, opened at registration once its start time was checked
    #: (None where pidfds are unavailable); closed when the task ends.
    pidfd: int | None = None

    def add_gpu(self, gpu: int, conn_id: int) -> None:
        """Count the task on ``gpu`` too while connection ``conn_id`` lasts: a process of it
        (a rank of a multi-GPU job) said it uses that GPU, so a more important task there
        preempts the whole task."""
        if gpu not in self.gpus and len(self.gpus) < MAX_GPUS:
            self.gpus = (*self.gpus, gpu)
            self.rank_gpus[conn_id] = gpu

    def drop_rank(self, conn_id: int) -> None:
        """The process of connection ``conn_id`` is gone: the GPU only it added goes too."""
        gpu = self.rank_gpus.pop(conn_id, None)
        if gpu is not None and gpu not in self.rank_gpus.values():
            self.gpus = tuple(g for g in self.gpus if g != gpu) or self.gpus

    @property
    def suspended(self) -> bool:
        """Whether it cannot use the GPU now (suspended, waiting its turn, or evicted)."""
        return self.state in STOPPED

    @property
    def waiting_turn(self) -> bool:
        """Suspended only because a peer of equal priority has the turn (policy/turns.py)."""
        return self.state is TaskState.WAITING_TURN

    @property
    def evicted(self) -> bool:
        """Its GPU memory is on the host (memory.py)."""
        return self.state is TaskState.EVICTED

    @property
    def barriers_on(self) -> bool:
        """Whether its gate puts stream barriers: the GPU holds its queued work by itself."""
        return any(c.barriers_on for c in self.controls.values())

    @property
    def driver_gate(self) -> str:
        """Its processes' driver-level gate: ``on`` where every one that has one holds with it,
        else the state of one that does not (``released``, ``unavailable``, ``failed``);
        ``none`` where none has one."""
        states = {c.driver_gate for c in self.controls.values()} - {"none"}
        if not states:
            return "none"
        return "on" if states == {"on"} else sorted(states - {"on"})[0]

    @property
    def held_on_gpu(self) -> bool:
        """Whether, its gate closed, nothing it queued can run on: its driver-level gate sees
        and holds every launch, or (without one) its operator gate's barriers hold its queue;
        and no check found its work going on. Else the driver lock backs its gate up."""
        if self.hold_leaked or self.driver_gate not in ("on", "none"):
            return False
        return self.barriers_on or self.driver_gate == "on"

    @property
    def driver_launches(self) -> int:
        """Launches its driver-level gates saw, over its processes."""
        return sum(c.driver_launches for c in self.controls.values() if c.driver_gate == "on")

    @property
    def hinted(self) -> bool:
        """Whether it says when it is active with ``request()`` (then only its requests count)."""
        return any(c.hinted for c in self.controls.values())

    @property
    def marker(self) -> str:
        """What says when the task is active, as ``status`` shows it: the server framework
        whose requests a process marks without code (``asgi``, ``grpc``), else ``always``
        (``--always-active``), ``request()`` (marked by hand), ``launches`` (its GPU work, seen
        by its gate), or ``none``."""
        marked = sorted({c.marker for c in self.controls.values()} - {""})
        if marked:
            return "+".join(marked)
        if self.always_active:
            return "always"
        if self.hinted:
            return "request()"
        return "launches" if any(c.gate_installed for c in self.controls.values()) else "none"

    @property
    def active(self) -> bool:
        """Whether the task wants the GPU now."""
        return self.always_active or any(c.is_active() for c in self.controls.values())

    @property
    def gated(self) -> bool:
        """Whether an in-process gate bounds what the task keeps queued."""
        return kind(self.mechanism).closes_gate and any(
            c.gate_installed for c in self.controls.values()
        )

    @property
    def status_word(self) -> str:
        """The state as ``status``, ``top`` and the metrics show it: the state's value, but
        ``held`` for a held task (suspended, or not yet), ``suspended`` while it waits its
        turn (``waiting_turn`` says so)."""
        if self.evicted:
            return "evicted"
        if self.suspended:
            return "held" if self.held else "suspended"
        if self.suspend_error is not None:
            return "unprotected"
        return "held" if self.held else "running"

    @property
    def gpu(self) -> int:
        """The first GPU, for events and metrics labels."""
        return self.gpus[0] if self.gpus else 0

    def event_fields(self) -> dict[str, Any]:
        """The fields that name this task in an event log record."""
        return {"task": self.name, "task_id": self.task_id, "pid": self.pid, "gpu": self.gpu}

    def target(self, whole_group: bool = True) -> Target:
        """What a mechanism acts on; ``whole_group`` False: the process alone, even if it
        leads a group (some member of which belongs to another user)."""
        control = next(iter(self.controls.values()), None)
        pgid = self.pgid if whole_group else None
        return Target(
            pid=self.pid, pgid=pgid, control=control, start_time=self.start_time, pidfd=self.pidfd
        )

    def view(self, now: float | None = None) -> TaskView:
        """The task for the policy, with its activity as the daemon last observed it."""
        if self.was_active:
            idle_s = 0.0
        elif self.last_active is None or now is None:
            idle_s = float("inf")
        else:
            idle_s = max(0.0, now - self.last_active)
        return TaskView(
            task_id=self.task_id,
            priority=self.priority,
            gpus=self.gpus,
            active=self.was_active,
            suspended=self.suspended,
            held=self.held,
            timeslice_ms=self.timeslice_ms,
            min_share=self.min_share,
            run_seconds=self.run_seconds,
            gated=self.gated,
            barriers=self.gated and self.barriers_on,
            hinted=self.hinted,
            idle_s=idle_s,
        )

    def describe(self, now: float) -> dict[str, Any]:
        """The task as ``gpreempt status --json`` shows it."""
        suspended_seconds = self.suspended_seconds
        if self.suspended and self.suspended_since is not None:
            suspended_seconds += now - self.suspended_since
        gate = None
        control = next(iter(self.controls.values()), None)
        if control is not None:
            stats = control.stats()
            gate = {
                "installed": stats.gate_installed,
                "launches": stats.launches,
                "waits": stats.waits,
                "wait_seconds": round(stats.wait_seconds, 6),
                "window": stats.window,
                "requests": stats.requests,
                # stream barriers hold its queue; the daemon lets it sleep (hook off, its
                # barriers put by a thread of the gate)
                "barriers": self.barriers_on,
                "sleep_ok": self.sleep_ok,
                # the driver-level gate: on, none, released (to a profiler), unavailable
                "driver": self.driver_gate,
                "driver_launches": sum(c.driver_launches for c in self.controls.values()),
                "driver_barriers": sum(c.stats().driver_barriers for c in self.controls.values()),
                "driver_waits": sum(c.stats().driver_waits for c in self.controls.values()),
                # its callbacks are off (barriers put by its thread)
                "driver_asleep": any(c.stats().driver_asleep for c in self.controls.values()),
                "hold_leaks": self.hold_leaks,
            }
        return {
            "task_id": self.task_id,
            "pid": self.pid,
            "name": self.name,
            "priority": self.priority,
            "priority_name": priority_name(self.priority),
            "gpus": list(self.gpus),
            # its processes with a channel (the ranks of a multi-GPU job, say)
            "processes": len(self.controls),
            "mechanism": self.mechanism,
            "state": self.status_word,
            "suspend_error": self.suspend_error,
            "waiting_turn": self.waiting_turn,
            "active": self.active,
            "marker": self.marker,
            "always_active": self.always_active,
            "held": self.held,
            "preemptions": self.preemptions,
            "turns": self.turns,
            "degradations": self.degradations,
            "suspended_seconds": round(suspended_seconds, 6),
            "last_suspend_ms": self.last_suspend_ms,
            "last_mechanism": self.suspended_with,
            "backstop_locked": self.backstop_locked,
            "uid": self.uid,
            "timeslice_ms": self.timeslice_ms,
            "min_share": self.min_share,
            "reserve_bytes": self.reserve_bytes,
            "evicted_bytes": self.evicted_bytes,
            "gate": gate,
        }


class Registry:
    """Tasks by id, with lookup by name or pid."""

    def __init__(self) -> None:
        self.tasks: dict[int, Task] = {}
        self._next_id = 1

    def new_id(self) -> int:
        task_id = self._next_id
        self._next_id += 1
        return task_id

    def add(self, task: Task) -> None:
        self.tasks[task.task_id] = task

    def snapshot(self, now: float) -> Snapshot:
        """Every task as the policy sees it at daemon time ``now``."""
        return Snapshot(now=now, tasks=tuple(t.view(now) for t in self.tasks.values()))

    def add_pidfd(self, task: Task) -> None:
        """Open the pidfd of ``task``'s process, checked against its start time."""
        from ..procinfo import open_verified

        try:
            task.pidfd = open_verified(task.pid, task.start_time)
        except (OSError, AttributeError):
            task.pidfd = None  # no pidfds here: signals check the start time each time

    def remove(self, task_id: int) -> Task | None:
        task = self.tasks.pop(task_id, None)
        if task is not None and task.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(task.pidfd)
            task.pidfd = None
        return task

    def by_pid(self, pid: int) -> Task | None:
        return next((t for t in self.tasks.values() if t.pid == pid), None)

    def count_of(self, uid: int) -> int:
        """Tasks of ``uid``."""
        return sum(1 for t in self.tasks.values() if t.uid == uid)

    def name_taken(self, name: str, uid: int) -> Task | None:
        """The task of ``uid`` already named ``name``, if any (names are unique per owner)."""
        return next((t for t in self.tasks.values() if t.uid == uid and t.name == name), None)

    def free_name(self, name: str, uid: int) -> str:
        """``name``, or ``name-2``, ``name-3``... : the first no task of ``uid`` uses."""
        candidate, n = name, 1
        while self.name_taken(candidate, uid) is not None:
            n += 1
            candidate = f"{name}-{n}"
        return candidate

    def find(self, target: str, uid: int | None = None) -> Task:
        """The task whose pid ``target`` is, else the one named ``target``: among ``uid``'s
        own tasks first, so that no other user's task name can shadow them."""
        text = str(target).strip()
        matches: list[Task] = []
        if text.isdigit():
            number = int(text)
            matches = [t for t in self.tasks.values() if t.pid == number]
        if not matches and uid is not None:
            matches = [t for t in self.tasks.values() if t.name == text and t.uid == uid]
        if not matches:
            matches = [t for t in self.tasks.values() if t.name == text]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            pids = ", ".join(str(t.pid) for t in matches)
            raise NoSuchTask(f"{len(matches)} tasks are named {text!r} (pids {pids}): use a pid")
        known = ", ".join(sorted(f"{t.name} ({t.pid})" for t in self.tasks.values())) or "none"
        if len(self.tasks) > 20:
            known = f"{len(self.tasks)} tasks (see `gpreempt status`)"
        raise NoSuchTask(f"no task named or with pid {text!r}; registered tasks: {known}")
