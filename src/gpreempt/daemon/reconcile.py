"""One scheduling pass: observe, decide, plan, apply.

After every change the daemon observes each task's activity (its control blocks), takes a
snapshot and runs the scheduling loop's pass (``policy/loop.py``, the one the in-process
scheduler and the simulator run too: run time credited, the policy asked), turns the
decision into a frozen :class:`~gpreempt.daemon.plan.Plan` and has the executor
(``apply.py``) carry it out. Gates close before anything is written: the event log waits,
the waiting task does not.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ..mechanisms import kind
from ..policy import Policy, Snapshot
from ..policy.loop import LoopState, run_pass
from .apply import Executor
from .apply_gates import GateExecutor
from .apply_memory import MemoryExecutor
from .backstop import Backstop
from .event_log import EventLog
from .peer import Peer
from .plan import PeerFacts, Plan, PlanSettings, TaskFacts, plan, plan_watches
from .registry import Registry
from .task import Task


class Host(Protocol):
    """What a scheduling pass uses of the daemon."""

    registry: Registry
    peers: dict[int, Peer]
    events: EventLog
    backstop: Backstop
    memory: MemoryExecutor
    executor: Executor
    gates: GateExecutor

    def persist(self) -> None: ...
    def publish_states(self) -> None: ...


class Reconciler:
    """Runs scheduling passes for the daemon, keeping what passes hand to each other."""

    def __init__(self, host: Host, policy: Policy, settings: PlanSettings) -> None:
        self.host = host
        self.policy = policy
        self.settings = settings
        #: What the last pass handed the next (the policy's memory among it).
        self.loop = LoopState()
        #: When to run a pass again even if nothing changes (None: on the next change).
        self.wake_at: float | None = None
        #: What the watch lists were last worked out from (they change only with it).
        self._watch_signature: tuple[Any, ...] | None = None

    def reconcile(self) -> None:
        """Ask the policy, then suspend and resume whatever differs from its answer."""
        host = self.host
        now = time.monotonic()
        with host.events.batch():
            self._observe(now)
            step = run_pass(self.policy, self.loop, host.registry.snapshot(now))
            self.loop = step.state
            host.executor.credit_run_time(step.run_seconds())
            todo = self.plan(step.snapshot, step.decision)
            if host.executor.apply_suspensions(todo, now):
                host.persist()
                host.publish_states()
        host.gates.apply_gates(todo)
        host.executor.apply_backstop(host.backstop.plan(now))
        due = [t for t in (todo.wake_at, host.backstop.next_due()) if t is not None]
        self.wake_at = min(due) if due else None
        if host.memory.needed():
            host.memory.enforce_reserves()

    def plan(self, snapshot: Snapshot, decision: Any) -> Plan:
        """The plan for ``decision``, with the watch lists worked out only if what they
        depend on changed since last time."""
        return plan(
            snapshot,
            decision,
            self.task_facts(),
            self.peer_facts(),
            self.settings,
            watches=self._watches_due(),
        )

    def update_watches(self, force: bool = False) -> None:
        """Send the watch lists that changed (``force``: even if the tasks did not; a new
        channel is ready for its first)."""
        if not self._watches_due() and not force:
            return
        snapshot = self.host.registry.snapshot(time.monotonic())
        watches = plan_watches(snapshot, self.task_facts(), self.peer_facts(), self.settings.watch)
        self.host.gates.send_watches(watches)

    def _watches_due(self) -> bool:
        tasks = self.host.registry.tasks.values()
        signature = tuple(
            (t.task_id, t.priority, t.gpus, t.held, t.uid, tuple(t.controls)) for t in tasks
        )
        if signature == self._watch_signature:
            return False
        self._watch_signature = signature
        return True

    def task_facts(self) -> tuple[TaskFacts, ...]:
        return tuple(_facts(t) for t in self.host.registry.tasks.values())

    def peer_facts(self) -> tuple[PeerFacts, ...]:
        return tuple(
            PeerFacts(
                conn_id=p.conn_id,
                channel_task=p.channel_task,
                channel_ready=p.channel_ready,
                watching=p.watching,
                watch_version=p.watch_version,
            )
            for p in self.host.peers.values()
        )

    def _observe(self, now: float) -> None:
        """Read each task's activity from its control blocks; log the changes."""
        for task in self.host.registry.tasks.values():
            active = task.active
            if active or task.was_active:
                task.last_active = now
            if active != task.was_active:
                task.was_active = active
                self.host.events.write("active" if active else "idle", **task.event_fields())


def _facts(task: Task) -> TaskFacts:
    return TaskFacts(
        task_id=task.task_id,
        priority=task.priority,
        uid=task.uid,
        suspended=task.suspended,
        held=task.held,
        waiting_turn=task.waiting_turn,
        evicted=task.evicted,
        unprotected=task.suspend_error is not None,
        closes_gate=kind(task.mechanism).closes_gate,
        backed_up=kind(task.mechanism).backed_up,
        always_active=task.identity.always_active,
        controls=tuple(task.controls),
        window_share_ms=task.window_share_ms,
        sleep_ok=task.sleep_ok,
        holds_itself=task.gated and task.held_on_gpu,
        quiet=task.quiet,
    )
