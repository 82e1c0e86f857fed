"""The daemon's answers to its clients' requests, one method per op (protocol.OPS).

Each handler checks its fields and the caller's rights (SO_PEERCRED: a client acts only on
its own processes unless it is root), changes the registry, and asks for a scheduling pass
when the change can matter; it returns the fields of its reply. A refusal is raised as a
GpreemptError and goes back as ``{"ok": false, ...}``, never as a dropped connection.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..control_block import ControlBlock
from ..errors import GpreemptError, NoSuchProcess, PermissionDenied, ProtocolError, UsageError
from ..field_checks import BadField
from ..mechanisms import MechanismSet, kind
from ..messages import ChannelRequest, HoldRequest, RegisterRequest, TargetRequest, TaskFields
from ..procinfo import ProcessInfo, can_use_gpu, is_descendant, pid_seen_by_peer, read_process
from ..protocol import OPS, Message, error_reply
from .apply_memory import MemoryExecutor
from .event_log import EventLog
from .limits import Limits
from .peer import Peer
from .persist import StateFiles
from .registration import Registrar, check_owner
from .registry import Registry
from .task import Task


class Host(Protocol):
    """What the handlers use of the daemon."""

    runtime_dir: Path
    policy_name: str
    turn_ms: float
    started_at: float
    registry: Registry
    registrar: Registrar
    peers: dict[int, Peer]
    limits: Limits
    mechanisms: MechanismSet
    events: EventLog
    memory: MemoryExecutor
    state_files: StateFiles

    def reconcile(self) -> None: ...
    def end_task(self, task: Task, reason: str) -> None: ...
    def listen_to_doorbell(self, peer: Peer) -> None: ...


class Handlers:
    """Serves requests for the daemon (one thread: its loop)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._ops: dict[str, Callable[[Peer, Message, list[int]], dict[str, Any]]] = {
            op: getattr(self, f"op_{op}") for op in OPS
        }

    def handle(self, peer: Peer, message: Message, fds: list[int]) -> Message:
        """The reply to one request; closes the descriptors no handler took."""
        op = message.get("op")
        try:
            if op not in OPS:
                raise ProtocolError(f"unknown op {op!r}: expected one of {', '.join(sorted(OPS))}")
            return {"ok": True, **self._ops[op](peer, message, fds)}
        except BadField as exc:
            return error_reply(UsageError(f"bad {op!r} request: {exc}"))
        except GpreemptError as exc:
            return error_reply(exc)
        except (TypeError, ValueError, KeyError) as exc:
            return error_reply(ProtocolError(f"bad {op!r} request: {exc}"))
        finally:
            for fd in fds:  # fds a handler did not take (it clears the list when it does)
                with contextlib.suppress(OSError):
                    os.close(fd)

    # ------------------------------------------------------------------ tasks
    def op_ping(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        return {"pid": os.getpid(), "policy": self.host.policy_name}

    def op_register(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        request = RegisterRequest.from_wire(message)
        pid = pid_seen_by_peer(request.pid, peer.pid)  # a container names its own
        info = self.host.registrar.registrable(peer.uid, pid)
        existing = self.host.registry.by_pid(pid)
        if existing is not None:
            raise UsageError(f"process {pid} is already registered as task {existing.name!r}")
        task = self.add_task(peer, info, request.task, owned=request.owned)
        if not request.owned:
            task.attached = True
            if not self.host.state_files.save_attached(self.host.registry.tasks.values()):
                # a task a restarted daemon would not know: refused rather than half-managed
                self.host.end_task(task, "its record could not be written")
                raise UsageError(
                    f"cannot record attached process {pid} for a restarted daemon "
                    f"({self.host.state_files.last_error}); free some space and attach again"
                )
        self.host.reconcile()
        return {"task": task.describe(time.monotonic())}

    def add_task(self, peer: Peer, info: ProcessInfo, fields: TaskFields, owned: bool) -> Task:
        """Register a task; ``owned``: it ends when this peer's connection closes."""
        registry = self.host.registry
        self.host.limits.check_task_count(info.uid, registry.count_of(info.uid))
        task = self.host.registrar.new_task(peer.uid, info, fields)
        registry.add_pidfd(task)
        registry.add(task)
        if owned:
            task.owner = peer.conn_id
            peer.owned_tasks.add(task.task_id)
        self.host.events.write(
            "registered", **task.event_fields(), mechanism=task.mechanism, priority=task.priority
        )
        return task

    def op_channel(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        """Bind the caller's control block to its task (registering the caller if asked).

        The caller is the process that connected, checked again now: its pid must still
        name the same process (start time) of the same user (SO_PEERCRED), so that a
        recycled pid registers nobody else's process."""
        if len(fds) != 2:
            raise ProtocolError("a channel request carries exactly two fds: memfd and eventfd")
        request = ChannelRequest.from_wire(message)
        if peer.control is not None:
            raise ProtocolError("this connection already has a channel")
        info = read_process(peer.pid)
        if peer.start_time is None or info.start_time != peer.start_time:
            raise NoSuchProcess(f"process {peer.pid}, which connected, has exited")
        if info.uid != peer.uid:
            raise PermissionDenied(
                f"process {peer.pid} now belongs to uid {info.uid}, not to the uid that "
                f"connected ({peer.uid}); not registered"
            )
        task = self.task_of(peer.pid)
        if task is not None and peer.uid not in (0, task.uid):
            raise PermissionDenied(
                f"process {peer.pid} runs under task {task.name!r} of uid {task.uid}; "
                f"you (uid {peer.uid}) may feed only your own tasks"
            )
        if task is None and request.register is None:
            raise NoSuchProcess(
                f"process {peer.pid} is not part of a registered task; start it with "
                "`gpreempt run` or pass register=True with a priority"
            )
        try:
            control = ControlBlock.adopt(fds[0], fds[1])
        except ValueError as exc:
            raise ProtocolError(f"bad channel: {exc}") from None
        fds.clear()  # the control block owns them now
        try:
            if task is None:
                info = self.host.registrar.registrable(peer.uid, peer.pid)
                assert request.register is not None
                task = self.add_task(peer, info, request.register, owned=True)
        except BaseException:
            control.close()
            raise
        peer.control = control
        peer.channel_task = task.task_id
        task.controls[peer.conn_id] = control
        if request.gpu is not None and can_use_gpu(peer.pid, request.gpu):
            task.add_gpu(request.gpu, peer.conn_id)
        self.host.listen_to_doorbell(peer)
        if task.suspended and kind(task.suspended_with).in_process:
            control.set_gate(True)
        control.set_window_share(task.window_share_ms)
        control.set_sleep_ok(task.sleep_ok)
        control.set_quiet(task.quiet)  # a block adopted again may say what its old daemon said
        self.host.reconcile()
        return {
            "task_id": task.task_id,
            "name": task.name,
            "priority": task.priority,
            "mechanism": task.mechanism,
        }

    def task_of(self, pid: int) -> Task | None:
        """The task whose process is ``pid`` or an ancestor of it."""
        direct = self.host.registry.by_pid(pid)
        if direct is not None:
            return direct
        for task in self.host.registry.tasks.values():
            if is_descendant(pid, task.pid):
                return task
        return None

    # ------------------------------------------------------------------ status
    def op_status(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        host = self.host
        now = time.monotonic()
        watched = self.watched_by_task()
        return {
            "daemon": {
                "pid": os.getpid(),
                "policy": host.policy_name,
                "turn_ms": host.turn_ms,
                "runtime_dir": str(host.runtime_dir),
                "started_at": host.started_at,
                "lock_available": host.mechanisms.lock_unavailable is None,
                "lock_unavailable_reason": host.mechanisms.lock_unavailable,
                "connections": len(host.peers),
                # writes that failed (a full disk): counted, never fatal
                "event_write_failures": host.events.failed,
                "state_write_failures": host.state_files.write_failures,
                "last_write_error": host.state_files.last_error or host.events.last_error,
            },
            "tasks": [
                {**t.describe(now), "watching": watched.get(t.task_id, [])}
                for t in host.registry.tasks.values()
            ],
        }

    def watched_by_task(self) -> dict[int, list[int]]:
        """For each task, the ids of the tasks whose blocks its gates watch (policy/watch.py)."""
        ids: dict[int, set[int]] = {}
        for peer in self.host.peers.values():
            if peer.channel_task is not None and peer.watching:
                ids.setdefault(peer.channel_task, set()).update(h for h, _c in peer.watching)
        return {task_id: sorted(found) for task_id, found in ids.items()}

    # ------------------------------------------------------------------ one named task
    def target_task(self, peer: Peer, target: str) -> Task:
        """The task a hold/evict/restore/detach request names (pid first, then the caller's
        own names), once the caller is checked to own it."""
        task = self.host.registry.find(target, uid=peer.uid)
        check_owner(peer.uid, task.uid, f"task {task.name!r}")
        return task

    def op_hold(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        request = HoldRequest.from_wire(message)
        task = self.target_task(peer, request.target)
        hold = request.hold
        if task.held != hold:
            task.held = hold
            self.host.events.write(
                "hold" if hold else "release",
                **task.event_fields(),
                reason=f"by uid {peer.uid} (pid {peer.pid})",
            )
            self.host.reconcile()
        return {"task": task.describe(time.monotonic())}

    def op_detach(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        """Unregister a task: resumed first, then forgotten (its process goes on unmanaged)."""
        task = self.target_task(peer, TargetRequest.from_wire(message).target)
        if task.evicted and not self.host.memory.restore(task, reason="detach"):
            raise UsageError(
                f"task {task.name!r} is evicted and there is no room to restore it yet; "
                "try again later"
            )
        described = task.describe(time.monotonic())
        self.host.end_task(task, detach_reason(peer, task, message.get("exit_status")))
        for other in self.host.peers.values():
            other.owned_tasks.discard(task.task_id)
        self.host.reconcile()
        return {"task": described}

    def op_evict(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        task = self.target_task(peer, TargetRequest.from_wire(message).target)
        self.host.memory.evict(task, reason=f"by uid {peer.uid}")
        return {"task": task.describe(time.monotonic())}

    def op_restore(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        task = self.target_task(peer, TargetRequest.from_wire(message).target)
        if not self.host.memory.restore(task, reason=f"by uid {peer.uid}"):
            return {"task": task.describe(time.monotonic()), "pending": True}
        self.host.reconcile()
        return {"task": task.describe(time.monotonic()), "pending": False}


def detach_reason(peer: Peer, task: Task, exit_status: Any) -> str:
    """Why a task ends on ``detach``: its launcher says how its command ended (a code, or
    minus the signal that killed it, as ``gpreempt run`` reads it before reaping it)."""
    if task.owner != peer.conn_id or isinstance(exit_status, bool):
        return f"detached by uid {peer.uid}"
    if isinstance(exit_status, int) and 0 <= exit_status <= 255:
        return f"its command exited (code {exit_status})"
    if isinstance(exit_status, int) and -64 <= exit_status < 0:
        with contextlib.suppress(ValueError):
            return f"its command was killed by {signal.Signals(-exit_status).name}"
        return f"its command was killed by signal {-exit_status}"
    return f"detached by uid {peer.uid}"
