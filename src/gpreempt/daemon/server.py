"""The node daemon: its loop, its listening socket and its client connections.

One thread runs everything: a selector over the listening socket, client connections,
client doorbells (eventfds) and a self-pipe for signals. After every change it runs a
scheduling pass (reconcile.py: the policy's decision, turned into a plan by plan.py and
carried out by apply.py). Requests are small and rare (registration, activity changes,
status; handlers.py answers them), so one thread keeps the state simple and every decision
ordered.

So that one thread can serve clients it cannot trust, nothing a client does may block it or
stop it: replies go out through bounded non-blocking queues (outbox.py), each client and each
user is held to limits (limits.py), every step of the loop runs inside its error handling,
and failed writes to the disk are counted, never fatal.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ..config import EVENTS_NAME, STATE_NAME
from ..errors import GpreemptError, UsageError
from ..mechanisms import MechanismSet
from ..names import PolicyName
from ..policy import PolicySettings, make_policy
from ..policy.inflight import DEFAULT_BUDGET_MS
from ..policy.sleep import DEFAULT_SLEEP_AFTER_S
from ..policy.turns import DEFAULT_TURN_MS
from . import limits as bounds
from .apply import Executor
from .apply_gates import GateExecutor
from .apply_memory import MemoryExecutor
from .backstop import DEFAULT_DELAY_MS, Backstop
from .connections import Connections
from .event_log import EventLog
from .gpu_busy import GpuBusy
from .handlers import Handlers
from .hold_meter import HoldMeter
from .identity import GroupCensus, protected_pids
from .lifecycle import TaskLifecycle
from .limits import Limits
from .memory import MemoryMover
from .peer import Peer
from .persist import StateFiles, resume_leftovers
from .plan import MAX_WATCH_VERSION, PlanSettings
from .reconcile import Reconciler
from .registration import Registrar
from .registry import Registry
from .runtime_claim import RuntimeClaim
from .runtime_guard import check_runtime_dir, listen
from .task import Task

#: How often the loop checks that tasks' processes still exist.
LIVENESS_PERIOD_S = 0.2
__all__ = ["Daemon", "LIVENESS_PERIOD_S", "MAX_WATCH_VERSION", "Peer"]


class Daemon:
    """``gpreempt serve``: owns the runtime directory while it runs."""

    def __init__(
        self,
        runtime_dir: Path,
        *,
        policy: str = PolicyName.HPF,
        shared: bool = False,
        metrics_port: int | None = None,
        metrics_addr: str = "127.0.0.1",
        lock_timeout_ms: int | None = None,
        inflight_budget_ms: float = DEFAULT_BUDGET_MS,
        backstop_ms: float = DEFAULT_DELAY_MS,
        watch: bool = True,
        watch_resume: bool = True,
        turn_ms: float = DEFAULT_TURN_MS,
        sleep_after_s: float = DEFAULT_SLEEP_AFTER_S,
        log: Callable[[str], None] | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.runtime_dir = runtime_dir
        built = make_policy(policy, PolicySettings(turn_ms, inflight_budget_ms))
        self.policy_name = built.name
        #: Length of the turns gated peers below a more important task take
        #: (policy/turns.py); 0 = they launch side by side.
        self.turn_ms = built.turn_ms
        self.shared = shared
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr
        self.lock_timeout_ms = lock_timeout_ms
        self.backstop_ms = backstop_ms
        # Gates watch the tasks that outrank them, and sleep once those were idle a while,
        # under strict priority only (policy/watch.py, policy/sleep.py).
        watch = watch and built.strict_priority
        settings = PlanSettings(
            inflight_budget_ms=inflight_budget_ms,
            turns=self.turn_ms > 0,
            sleep_after_s=sleep_after_s if built.strict_priority else 0.0,
            watch=watch,
            watch_resume=watch_resume and watch,
        )
        self.log = log or (lambda message: None)
        self.registry = Registry()
        self.selector = selectors.DefaultSelector()
        self.started_at = time.time()
        self.stopping = False
        #: Why the daemon stopped serving by itself (its runtime directory lost), if it did.
        self.lost: str | None = None
        self._last_liveness = 0.0
        self.metrics: Any = None
        #: Set when something changed outside a scheduling pass (a restore): run one soon.
        self.dirty = False
        self.limits = limits or Limits(shared=shared)
        self.limits.shared = shared
        #: Which process groups hold only their owner's processes, this scheduling pass.
        self.census = GroupCensus()
        self.claim = RuntimeClaim(runtime_dir, shared)
        # the pids never to stop are read when used: the daemon's ancestors exit
        self.registrar = Registrar(
            self.registry, self.limits, lambda: self.mechanisms, protected_pids
        )
        self.executor = Executor(self)
        self.gates = GateExecutor(self)
        self.reconciler = Reconciler(self, built.decide, settings)
        self.handlers = Handlers(self)
        self.connections = Connections(
            self.selector,
            self.limits,
            self.registry,
            handle=self.handlers.handle,
            on_channel=lambda: self.reconciler.update_watches(force=True),
            on_change=self.reconcile,
            end_task=self.end_task,
            log=self.log,
        )
        #: The connections, by id (the same dict as the connections').
        self.peers: dict[int, Peer] = self.connections.peers

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Take the runtime directory: lock, socket, event log, leftovers of a dead daemon."""
        if self.shared and os.getuid() != 0:
            raise UsageError("--shared serves every user and needs root")
        self.limits.size_for_fd_limit(bounds.raise_fd_limit())
        self.claim.take_lock()
        if self.metrics_port is not None:
            self._start_metrics()

        self.mechanisms = MechanismSet(self.lock_timeout_ms)
        self.events = EventLog(self.runtime_dir / EVENTS_NAME)
        self.state_files = StateFiles(self.runtime_dir, STATE_NAME, self.log)
        self.memory = MemoryExecutor(
            self.registry,
            self.events,
            MemoryMover(
                lock_unavailable=self.mechanisms.lock_unavailable,
                lock_timeout_ms=self.lock_timeout_ms,
            ),
            metrics=self.metrics,
            on_change=self._on_memory_change,
        )
        for record, outcome in resume_leftovers(self.state_files.state_path):
            self.events.write(
                "resume",
                task=record.name,
                pid=record.pid,
                mechanism=record.mechanism,
                reason=f"left suspended by a previous daemon: {outcome}",
            )
            self.log(f"process {record.pid} ({record.name}) left suspended: {outcome}")

        listen(self)

        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self.backstop = backstop_for(self)
        self.lifecycle = TaskLifecycle(
            self.registry,
            self.registrar,
            self.executor,
            self.events,
            self.memory,
            self.state_files,
            self.metrics,
            self.reconcile,
            self.log,
        )
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

        self.events.write("daemon-start", reason=f"policy {self.policy_name}", pid=os.getpid())
        self.lifecycle.reattach()
        self.dirty = True
        self.log(f"serving {self.claim.socket_path} (policy {self.policy_name})")

    def _start_metrics(self) -> None:
        """Serve metrics, before anything else is created: a port that cannot be bound
        leaves nothing behind (the lock is released and its file removed)."""
        from .prometheus import DaemonMetrics, gpu_uuids

        try:
            self.metrics = DaemonMetrics(gpu_uuids=gpu_uuids())
            self.metrics.start_http(self.metrics_port, self.metrics_addr)
        except BaseException:
            self.metrics = None
            with contextlib.suppress(OSError):
                self.claim.lock_path.unlink()
            self.claim.release()
            raise
        self.log(f"metrics on http://{self.metrics_addr}:{self.metrics.port}/metrics")

    def _on_memory_change(self, event: str) -> None:
        """An eviction changed what a successor must resume: record it. A restore left a
        task locked: run a scheduling pass soon, which lets it run if the policy allows."""
        if event == "evict":
            self.persist()
        else:
            self.dirty = True

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def serve_forever(self) -> None:
        """Serve until a signal stops the daemon. A daemon that had to stop because it lost
        its runtime directory to another raises GpreemptError once it resumed everything, so
        that it exits nonzero (a supervisor with ``Restart=on-failure`` starts it again)."""
        try:
            while not self.stopping:
                self._serve_once()
        finally:
            self.shutdown()
        if self.lost is not None:
            raise GpreemptError(f"stopped: {self.lost}")

    def _serve_once(self) -> None:
        """One turn of the loop: whatever is ready, then the periodic checks. Every step is
        guarded: an error is logged and the daemon goes on."""
        now = time.monotonic()
        timeout = LIVENESS_PERIOD_S
        wake_at = self.reconciler.wake_at
        if wake_at is not None:
            timeout = max(0.0, min(timeout, wake_at - now))
        connections = self.connections
        if connections.backlog:
            ready_at = min(p.paused_until for p in connections.backlog.values())
            timeout = max(0.0, min(timeout, ready_at - now))
        if connections.accept_paused_until and now >= connections.accept_paused_until:
            self._guarded("listen", connections.resume_accepting)
        for key, mask in self.selector.select(timeout):
            kind, data = key.data
            self.census = GroupCensus()
            if kind == "peer" and mask & selectors.EVENT_WRITE:
                self._guarded(kind, connections.on_writable, data)
                if data.conn_id not in self.peers or not mask & selectors.EVENT_READ:
                    continue
            handler = {
                "listen": connections.accept,
                "peer": connections.on_readable,
                "doorbell": connections.on_doorbell,
                "wake": self._drain_wake,
            }[kind]
            self._guarded(kind, handler, *(() if data is None else (data,)))
        if connections.backlog:
            self.census = GroupCensus()
            now = time.monotonic()
            for peer in list(connections.backlog.values()):
                if peer.paused_until <= now and peer.conn_id in self.peers:
                    self._guarded("peer", connections.serve_backlog, peer)
        now = time.monotonic()
        if now - self._last_liveness >= LIVENESS_PERIOD_S:
            self._last_liveness = now
            self.census = GroupCensus()
            self._guarded("liveness", self.lifecycle.check_liveness)
            self._guarded("runtime directory", check_runtime_dir, self)
        wake_at = self.reconciler.wake_at
        if self.dirty or (wake_at is not None and now >= wake_at):
            self.dirty = False
            self.census = GroupCensus()
            self._guarded("scheduling", self.reconcile)

    def _guarded(self, kind: str, step: Callable[..., Any], *args: Any) -> None:
        """Run one step of the loop; a failure is logged (and a failing client dropped), never
        fatal: one bad client or one full disk must not take the daemon down."""
        try:
            step(*args)
        except Exception as exc:
            self.log(f"error handling {kind}: {exc!r}")
            if kind in ("peer", "doorbell") and args and isinstance(args[0], Peer):
                with contextlib.suppress(Exception):
                    self.connections.drop_peer(args[0])

    def shutdown(self) -> None:
        """Resume every suspended task, then release the runtime directory. Each step is
        guarded: whatever fails (a full disk, a lost directory), every task is resumed."""
        self.lifecycle.resume_all(reason="daemon stopping")
        for step in (self.backstop.finish, self.persist, self.lifecycle.persist_attached):
            try:
                step()
            except Exception as exc:
                self.log(f"error on shutdown: {exc!r}")
        self.events.write("daemon-stop", pid=os.getpid())
        for peer in list(self.peers.values()):
            if peer.outbox is not None:
                with contextlib.suppress(OSError):
                    peer.outbox.flush()
                peer.outbox.discard()
            peer.connection.close()
        self.claim.remove_socket()  # never another daemon's socket
        self.listener.close()
        signal.set_wakeup_fd(-1)
        self.events.close()
        if self.metrics is not None:
            self.metrics.stop_http()
        self.claim.release()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass
        if self.backstop.collect():  # a backstop lock finished
            self.persist()
        self.dirty = True  # a pass: signals may take the place of a lock that failed

    # ------------------------------------------------------------------ scheduling
    def reconcile(self) -> None:
        """Run a scheduling pass now (reconcile.py)."""
        self.reconciler.reconcile()

    def persist(self) -> None:
        self.lifecycle.persist()

    def record_stops(self, about_to: dict[int, str]) -> bool:
        """Record, durably, the tasks about to be stopped (by id, with the mechanism) before
        they are: False if that could not be written (the stop must not be made)."""
        return self.state_files.save_suspended(self.registry.tasks.values(), about_to)

    def state_files_error(self) -> str | None:
        return self.state_files.last_error

    def publish_states(self) -> None:
        self.lifecycle.publish_states()

    def end_task(self, task: Task, reason: str) -> None:
        self.lifecycle.end_task(task, reason)

    def send(self, peer: Peer, data: bytes, fds: list[int] | None = None) -> None:
        """Send ``data`` (and ``fds``) to ``peer`` without blocking (connections.py)."""
        self.connections.send(peer, data, fds)

    def listen_to_doorbell(self, peer: Peer) -> None:
        self.connections.listen_to_doorbell(peer)


def backstop_for(daemon: Daemon) -> Backstop:
    """The daemon's backstop: the driver lock where this machine has one, else signals that
    its executor sends; its meter reads the CPU time of each task's channel processes (those
    that hold its gates), and on NVIDIA machines NVML's samples of held tasks' GPUs."""
    return Backstop(
        daemon.registry,
        daemon.events,
        daemon.backstop_ms,
        lock_available=daemon.mechanisms.lock_unavailable is None,
        wake_fd=daemon._wake_w,
        signals=True,
        meter=HoldMeter(partial(channel_pids, daemon.peers)),
        gpu_busy=GpuBusy() if daemon.mechanisms.lock_unavailable is None else None,
        watching=partial(watched_blocks, daemon.peers),
    )


def channel_pids(peers: dict[int, Peer], task: Task) -> list[int]:
    """The processes that hold ``task``'s gates: those of its channels."""
    return [peer.pid for conn in task.controls if (peer := peers.get(conn)) is not None]


def watched_blocks(peers: dict[int, Peer], conn: int) -> tuple[tuple[int, int], ...]:
    """The blocks (task id, connection) the gate of connection ``conn`` watches."""
    peer = peers.get(conn)
    return peer.watching if peer is not None else ()
