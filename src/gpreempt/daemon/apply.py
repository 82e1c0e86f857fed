"""Carry out a :class:`~gpreempt.daemon.plan.Plan`: suspend, resume, write control blocks,
send watch lists.

Everything here acts on the world (signals, driver calls, shared memory, sockets) and records
what happened (the task's counters, the event log, metrics); what to do was decided by
``daemon/plan.py``. A suspension can fail: the task then shows as ``unprotected`` until a
suspension succeeds or the policy no longer wants it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..control import CLOSED, ControlBlock, closed_while_watched
from ..errors import GpreemptError, NoSuchProcess, ProtocolError
from ..mechanisms import MechanismSet
from ..mechanisms.base import Target
from ..protocol import MAX_REPLY, encode
from .backstop import Backstop
from .event_log import EventLog
from .identity import GroupCensus
from .peer import Peer
from .plan import Plan, WatchList
from .registry import Registry, Task
from .task_state import TaskState, change_state


class Host(Protocol):
    """What the executor uses of the daemon: its tasks, connections and mechanisms."""

    registry: Registry
    peers: dict[int, Peer]
    mechanisms: MechanismSet
    events: EventLog
    backstop: Backstop
    metrics: Any
    census: GroupCensus
    log: Callable[[str], None]

    def send(self, peer: Peer, data: bytes, fds: list[int] | None = None) -> None: ...


class Executor:
    """Applies plans to the daemon's tasks (one thread: the daemon's loop)."""

    def __init__(self, host: Host) -> None:
        self.host = host

    # ------------------------------------------------------------------ plans
    def apply_suspensions(self, plan: Plan, now: float) -> bool:
        """Suspend, then resume, as ``plan`` says; returns whether any task's state changed
        (what a successor daemon must know then changed too)."""
        tasks = self.host.registry.tasks
        changed = False
        # Suspend first: a more important task is waiting for these.
        todo = {s.task_id: s for s in plan.suspend}
        for task in sorted(tasks.values(), key=lambda t: t.priority):
            turn = task.task_id in plan.turns
            step = todo.get(task.task_id)
            if step is not None:
                changed |= self.suspend(task, "turn" if step.turn else None, now=now)
            # a suspended task waits either for its turn or for a more important task
            wanted = TaskState.WAITING_TURN if turn else TaskState.SUSPENDED
            if task.state in (TaskState.SUSPENDED, TaskState.WAITING_TURN) and (
                task.state is not wanted
            ):
                change_state(task, wanted, now=now)
        for task_id in plan.protected_again:
            task = tasks[task_id]  # no longer unprotected: nothing to stop
            if task.state is TaskState.UNPROTECTED:
                change_state(task, TaskState.RUNNING, now=now)
            else:
                task.suspend_error = None  # the reason of a failure before it was evicted
            changed = True
        for task_id in plan.resume:
            changed |= self.resume(tasks[task_id], reason="policy")
        return changed

    def apply_gates(self, plan: Plan) -> None:
        """Tell the gates their in-flight shares and sleep permissions, send the watch lists
        that changed, and set the word of every closed gate: closed only while its watched
        tasks are active where the plan allows it, else closed plainly."""
        tasks = self.host.registry.tasks
        for task_id, share in plan.window_shares:
            task = tasks[task_id]
            task.window_share_ms = share
            for control in task.controls.values():
                control.set_window_share(share)
        for task_id, ok in plan.sleep:
            task = tasks[task_id]
            task.sleep_ok = ok
            for control in task.controls.values():
                control.set_sleep_ok(ok)
        self.send_watches(plan.watches or ())
        for task in tasks.values():
            for conn, control in task.controls.items():
                word = control.gate_word
                if word == 0:
                    continue  # open, or not this mechanism's to close
                version = plan.releases.get((task.task_id, conn), 0) if task.suspended else 0
                if version:
                    if word != closed_while_watched(version):
                        control.close_while_watched(version)
                elif word != CLOSED:
                    control.set_gate(True)

    def send_watches(self, watches: tuple[WatchList, ...]) -> None:
        """Push each connection its new watch list (read-only descriptors of the blocks)."""
        tasks = self.host.registry.tasks
        for watch in watches:
            peer = self.host.peers.get(watch.conn_id)
            if peer is None:
                continue
            peer.watch_version = watch.version
            blocks = [(t, c, tasks[t].controls[c]) for t, c in watch.blocks]
            self._send_watch(peer, blocks)
            peer.watching = watch.blocks

    def _send_watch(self, peer: Peer, blocks: list[tuple[int, int, ControlBlock]]) -> None:
        """Push ``peer`` its watch list with read-only descriptors of the blocks, through its
        outbox (the descriptors go with the message, whenever the client reads it)."""
        fds: list[int] = []
        try:
            fds = [control.read_only_fd() for _t, _c, control in blocks]
            owners = [self.host.peers.get(conn) for _t, conn, _b in blocks]
            message = {
                "push": "watch",
                "tasks": [task_id for task_id, _c, _b in blocks],
                # whose blocks: a gate left with barriers on them when this daemon is gone
                # clears those of owners that exit (client/stranded.py)
                "pids": [owner.pid if owner is not None else None for owner in owners],
                "version": peer.watch_version,
            }
            data = encode({**message, "nfds": len(fds)} if fds else message, MAX_REPLY)
        except (OSError, ProtocolError) as exc:
            self.host.log(f"cannot send the watch list to process {peer.pid}: {exc}")
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        self.host.send(peer, data, fds)

    # ------------------------------------------------------------------ one task
    def suspend(self, task: Task, reason: str | None = None, *, now: float) -> bool:
        """Suspend ``task`` by its mechanism; ``reason`` for the event log (default: held or
        policy; ``turn``: only for a peer's turn); ``now``: the pass's daemon time. Returns
        whether its state changed."""
        mechanisms = self.host.mechanisms
        mechanism = mechanisms.get(task.mechanism)
        target = self.target(task)
        start = time.perf_counter()
        try:
            used = mechanism.suspend(target)
        except NoSuchProcess:
            return False
        except GpreemptError as exc:
            if not mechanism.backed_up:
                return self._suspend_failed(task, task.mechanism, exc, now)
            try:
                used = mechanisms.get("signal").suspend(target)
            except NoSuchProcess:
                return False
            except GpreemptError as fallback:
                return self._suspend_failed(task, "signal", fallback, now)
        latency_ms = (time.perf_counter() - start) * 1e3
        degraded = mechanism.take_degradation(target)
        if degraded is not None:
            self._degraded(task, used, degraded)
        turn = reason == "turn"
        stopped = TaskState.WAITING_TURN if turn else TaskState.SUSPENDED
        change_state(task, stopped, now=time.monotonic(), mechanism=used)
        if turn:
            task.turns += 1
        else:
            task.preemptions += 1
        task.last_suspend_ms = round(latency_ms, 4)
        self.host.events.write(
            "suspend",
            **task.event_fields(),
            mechanism=used,
            latency_ms=latency_ms,
            reason=reason or ("held" if task.held else "policy"),
        )
        metrics = self.host.metrics
        if metrics is not None and turn:
            metrics.on_turn(task.gpu, task.name)
        elif metrics is not None:
            metrics.on_suspend(task.gpu, task.name, used, latency_ms / 1e3)
        return True

    def _suspend_failed(self, task: Task, mechanism: str, exc: Exception, now: float) -> bool:
        """Record that the policy wants ``task`` suspended and ``mechanism`` failed: its state
        becomes ``unprotected`` (status, top, metrics) until a suspension succeeds or the
        policy no longer wants it. The event log gets one line per new reason, not one per
        retry. Returns whether the task's state changed."""
        reason = f"suspend failed: {exc}"
        if self.host.metrics is not None:
            self.host.metrics.on_suspend_failed(task.gpu, task.name, mechanism)
        if task.suspend_error == reason:
            return False
        change_state(task, TaskState.UNPROTECTED, now=now, error=reason)
        self.host.events.write("error", **task.event_fields(), mechanism=mechanism, reason=reason)
        self.host.log(f"{task.name} (pid {task.pid}) is unprotected: {reason}")
        return True

    def _degraded(self, task: Task, used: str, reason: str) -> None:
        """Record that ``task``'s mechanism held less than it promises (kfd that suspended
        none of the task's queues, say) and ``used`` held it instead: an event, the task's
        counter, and a failure of its mechanism in the metrics."""
        task.degradations += 1
        self.host.events.write(
            "degraded", **task.event_fields(), mechanism=task.mechanism, used=used, reason=reason
        )
        self.host.log(f"{task.name} (pid {task.pid}): {reason}")
        if self.host.metrics is not None:
            self.host.metrics.on_suspend_failed(task.gpu, task.name, task.mechanism)

    def resume(self, task: Task, reason: str) -> bool:
        """Resume ``task`` with the mechanism that suspended it; returns whether it did."""
        used = task.suspended_with or "signal"
        start = time.perf_counter()
        self.host.backstop.release(task)
        try:
            self.host.mechanisms.concrete[used].resume(self.target(task))
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
        now = time.monotonic()
        suspended_for = now - (task.suspended_since or now)
        task.suspended_seconds += suspended_for
        change_state(task, TaskState.RUNNING, now=now)
        self.host.events.write(
            "resume",
            **task.event_fields(),
            mechanism=used,
            latency_ms=latency_ms,
            reason=reason,
            suspended_ms=round(suspended_for * 1e3, 4),
        )
        if self.host.metrics is not None:
            self.host.metrics.on_resume(task.gpu, task.name, suspended_for)
        return True

    def target(self, task: Task) -> Target:
        """What the mechanisms act on: the task's whole group only if every member belongs to
        its owner (a root daemon could otherwise stop a root process in a user's job), else
        its process alone; signals go to the process that started at its start time."""
        whole = task.pgid is None or os.geteuid() != 0
        if not whole:
            assert task.pgid is not None
            whole = self.host.census.owned_by(task.pgid, task.uid)
        return task.target(whole_group=whole)
