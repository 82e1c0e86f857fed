"""A task: one registered process, as three parts and what ties it to its processes.

Its *identity* (task_identity.py) is frozen: who it is and what it asked for, built once from
its registration's fields. Its *state* (task_state.py) is a frozen record that task_state alone
replaces, telling each change. Its *counters* (task_counters.py) are written by the executor
alone (apply.py, apply_memory.py). Readers reach the identity's names and the state's fields
through read-only properties; the rest of the identity through ``task.identity``.

The task itself keeps what changes with its processes and the daemon's loop: its control
blocks, GPUs and owner (handlers.py, registry.py), the operator's hold, its activity as last
observed (reconcile.py), and what the executor last told its gates and did behind them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..mechanisms import kind
from ..mechanisms.base import Target
from ..names import MechanismName
from ..policy import TaskView
from ..priority import priority_name
from .backstop_plan import HoldBaseline
from .task_counters import TaskCounters
from .task_gpus import TaskGpus
from .task_identity import TaskIdentity
from .task_state import STOPPED, StateRecord, TaskState

if TYPE_CHECKING:
    from ..control_block import ControlBlock


@dataclass
class Task:
    """One registered process: its identity, state and counters, and its live ties.
    Mutated only by the daemon's loop."""

    identity: TaskIdentity
    #: Where it stands with the GPU; replaced only by task_state (change_state).
    state_record: StateRecord = field(default_factory=StateRecord)
    #: What the executor counted of it.
    counters: TaskCounters = field(default_factory=TaskCounters)
    #: Its GPUs: those it registered on, and those its processes added while they run.
    gpu_set: TaskGpus = field(init=False)
    #: Id of the connection whose closing ends the task (its launcher), if any.
    owner: int | None = None
    #: Control blocks of in-process clients, keyed by connection id.
    controls: dict[int, ControlBlock] = field(default_factory=dict)
    #: Registered with ``attach`` (by pid, not owned by a connection): a restarted daemon
    #: registers it again from its persisted state.
    attached: bool = False
    #: A pidfd of its process, opened at registration once its start time was checked
    #: (None where pidfds are unavailable); closed when the task ends.
    pidfd: int | None = None
    #: An operator holds it suspended (``gpreempt suspend``), whatever the policy says.
    held: bool = False
    #: Activity as last observed by the daemon (events and policies use this one value).
    was_active: bool = False
    #: Daemon time it was last seen wanting the GPU (None: never).
    last_active: float | None = None
    #: GPU time (ms) its gate may keep in flight, as last written to its control blocks.
    window_share_ms: float | None = None
    #: Its gate may sleep, as last written to its control blocks (policy/sleep.py).
    sleep_ok: bool = False
    #: Whether its blocks were last told that every task it outranks holds itself on them.
    quiet: bool = False
    #: Also locked in the driver, behind its closed gate (mechanism auto; see backstop.py).
    backstop_locked: bool = False
    #: Also stopped with signals, behind its closed gate, where there is no lock (apply.py).
    backstop_signalled: bool = False
    #: Launches its driver-level gates had seen once its gate had held it a moment, this
    #: suspension, with the activity epochs of the blocks its gates watched then where they
    #: held it (backstop.py checks that the launches stand still); None before.
    hold_baseline: HoldBaseline | None = None
    #: Its GPU work went on while its gate was closed, this suspension (backstop.py).
    hold_leaked: bool = False
    #: A hold of it was found to leak: its gate's words no longer count (no turns, no sparing
    #: of the backstop) for as long as it lives (backstop_plan.py).
    gate_untrusted: bool = False
    #: Unlock right after restoring (the eviction's lock was not how the policy suspended it).
    evict_unlock: bool = False

    def __post_init__(self) -> None:
        self.gpu_set = TaskGpus(self.identity.gpus)

    # ------------------------------------------------------------------ its identity
    @property
    def task_id(self) -> int:
        return self.identity.task_id

    @property
    def pid(self) -> int:
        return self.identity.pid

    @property
    def uid(self) -> int:
        return self.identity.uid

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def priority(self) -> int:
        return self.identity.priority

    @property
    def mechanism(self) -> str:
        """The mechanism it asked for: auto, gate, lock, signal or kfd."""
        return self.identity.mechanism

    # ------------------------------------------------------------------ its state
    @property
    def state(self) -> TaskState:
        return self.state_record.state

    @property
    def suspended_with(self) -> str | None:
        """The concrete mechanism that suspended it (the last one, once it runs again)."""
        return self.state_record.suspended_with

    @property
    def suspended_since(self) -> float | None:
        return self.state_record.suspended_since

    @property
    def preempted_since(self) -> float | None:
        """Since when it is suspended for a more important task or held (not for a turn)."""
        return self.state_record.preempted_since

    @property
    def suspend_error(self) -> str | None:
        """Why the policy's last suspension of it failed, while it is unprotected."""
        return self.state_record.suspend_error

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPUs it counts on (task_gpus.py)."""
        return self.gpu_set.all

    def add_gpu(self, gpu: int, conn_id: int) -> bool:
        """A process of it (connection ``conn_id``) uses ``gpu``: True where that is new."""
        return self.gpu_set.add(gpu, conn_id)

    def drop_rank(self, conn_id: int) -> None:
        """The process of connection ``conn_id`` is gone, and the GPUs only it added."""
        self.gpu_set.drop(conn_id)

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
        if self.gate_untrusted or self.hold_leaked or self.driver_gate not in ("on", "none"):
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
        if self.identity.always_active:
            return "always"
        if self.hinted:
            return "request()"
        return "launches" if any(c.gate_installed for c in self.controls.values()) else "none"

    @property
    def active(self) -> bool:
        """Whether the task wants the GPU now."""
        return self.identity.always_active or any(c.is_active() for c in self.controls.values())

    @property
    def gated(self) -> bool:
        """Whether an in-process gate bounds what the task keeps queued: its client says so,
        and no hold of it was found to leak."""
        return (
            kind(self.mechanism).closes_gate
            and not self.gate_untrusted
            and any(c.gate_installed for c in self.controls.values())
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
        blocks = tuple(self.controls.values())
        installed = [c for c in blocks if c.gate_installed]
        control = installed[0] if installed else next(iter(blocks), None)
        pgid = self.identity.pgid if whole_group else None
        return Target(
            pid=self.pid,
            pgid=pgid,
            control=control,
            controls=blocks,
            start_time=self.identity.start_time,
            pidfd=self.pidfd,
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
            timeslice_ms=self.identity.timeslice_ms,
            min_share=self.identity.min_share,
            run_seconds=self.counters.run_seconds,
            gated=self.gated,
            barriers=self.gated and self.barriers_on,
            hinted=self.hinted,
            idle_s=idle_s,
            uid=self.uid,
        )

    def describe(self, now: float) -> dict[str, Any]:
        """The task as ``gpreempt status --json`` shows it."""
        suspended_seconds = self.counters.suspended_seconds
        if self.suspended and self.suspended_since is not None:
            suspended_seconds += now - self.suspended_since
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
            "always_active": self.identity.always_active,
            "held": self.held,
            "preemptions": self.counters.preemptions,
            "turns": self.counters.turns,
            "degradations": self.counters.degradations,
            "suspended_seconds": round(suspended_seconds, 6),
            "last_suspend_ms": self.counters.last_suspend_ms,
            "last_mechanism": self.suspended_with,
            "backstop_locked": self.backstop_locked,
            # what backs its gate up now: lock, signal or None
            "backstop": MechanismName.LOCK
            if self.backstop_locked
            else (MechanismName.SIGNAL if self.backstop_signalled else None),
            "uid": self.uid,
            "timeslice_ms": self.identity.timeslice_ms,
            "min_share": self.identity.min_share,
            "reserve_bytes": self.identity.reserve_bytes,
            "evicted_bytes": self.counters.evicted_bytes,
            "gate": gate_status(self),
        }


def gate_status(task: Task) -> dict[str, Any] | None:
    """Its gates as ``gpreempt status --json`` shows them (None: it has no channel): the
    counters of the block whose gate is installed, where it has several."""
    control = task.target().control
    if control is None:
        return None
    stats = control.stats()
    blocks = [c.stats() for c in task.controls.values()]  # each process's block, read once
    return {
        "installed": stats.gate_installed,
        "launches": stats.launches,
        "waits": stats.waits,
        "wait_seconds": round(stats.wait_seconds, 6),
        "window": stats.window,
        "requests": stats.requests,
        # stream barriers hold its queue; the daemon lets it sleep (hook off, its
        # barriers put by a thread of the gate)
        "barriers": task.barriers_on,
        "sleep_ok": task.sleep_ok,
        "quiet": task.quiet,
        # the driver-level gate: on, none, released (to a profiler), unavailable
        "driver": task.driver_gate,
        "driver_launches": sum(c.driver_launches for c in task.controls.values()),
        "driver_barriers": sum(b.driver_barriers for b in blocks),
        "driver_waits": sum(b.driver_waits for b in blocks),
        # launches that waited for its window (25 ms of GPU work in flight) to drain, and the
        # GPU time per launch it spaces its barriers by (the largest of its processes')
        "driver_bound_waits": sum(b.driver_bound_waits for b in blocks),
        "driver_us_per_launch": max((b.driver_us_per_launch for b in blocks), default=0.0),
        # its callbacks are off, its barriers put by its thread: asleep (nobody more important
        # active for a while) or paced (awake, its process queues no faster than its GPU runs);
        # detached: asleep with CUPTI let go (a task nothing preempts: a subscriber slows its
        # graph launches)
        "driver_asleep": any(b.driver_asleep for b in blocks),
        "driver_paced": any(b.driver_paced for b in blocks),
        "driver_detached": any(b.driver_detached for b in blocks),
        # its GPU work passed a stream barrier while a task it watches stayed active, of the
        # barriers whose pass the GPU-side check could date
        "barrier_leaks": sum(c.barrier_leaks for c in task.controls.values()),
        "barriers_checked": sum(b.driver_barriers_checked for b in blocks),
        "hold_leaks": task.counters.hold_leaks,
        # False once a hold leaked: its words no longer count
        "trusted": not task.gate_untrusted,
    }
