"""The node daemon: a registry of tasks per GPU, a policy, and the mechanisms that apply it.

One thread runs everything: a selector over the listening socket, client connections,
client doorbells (eventfds) and a self-pipe for signals. After every change it asks the
policy which tasks should be suspended and suspends or resumes the difference. Requests
are small and rare (registration, activity changes, status), so one thread keeps the state
simple and every decision ordered.

So that one thread can serve clients it cannot trust, nothing a client does may block it or
stop it: replies go out through bounded non-blocking queues (outbox.py), each client and each
user is held to limits (limits.py), every step of the loop runs inside its error handling,
and failed writes to the disk are counted, never fatal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import selectors
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import EVENTS_NAME, LOCK_NAME, SOCKET_NAME, STATE_NAME, ensure_private_dir
from ..control import CLOSED, ControlBlock, closed_while_watched
from ..errors import (
    DaemonAlreadyRunning,
    GpreemptError,
    NoSuchProcess,
    PermissionDenied,
    ProtocolError,
    UsageError,
)
from ..mechanisms import MechanismSet
from ..mechanisms.base import Target
from ..policy import Decision, Policy, Snapshot, get_policy
from ..policy.hpf import decide_hpf
from ..policy.inflight import DEFAULT_BUDGET_MS, inflight_shares
from ..policy.sleep import DEFAULT_SLEEP_AFTER_S, sleepers
from ..policy.turns import DEFAULT_TURN_MS, TurnSettings
from ..policy.watch import waited_for, watch_lists
from ..priority import parse_priority
from ..procinfo import alive, is_descendant, pid_seen_by_peer, read_process
from ..protocol import (
    MAX_FDS,
    MAX_MESSAGE,
    MAX_REPLY,
    OPS,
    Connection,
    Message,
    encode,
    error_reply,
)
from ..runtime_dir import FileIdentity
from . import limits as bounds
from . import persist
from .backstop import DEFAULT_DELAY_MS, Backstop
from .events import EventLog
from .identity import GroupCensus, clean_name, protected_pids
from .limits import Limits
from .outbox import Outbox
from .registry import Registry, Task

#: How often the loop checks that tasks' processes still exist.
LIVENESS_PERIOD_S = 0.2
MAX_GPUS = 64
#: How long the daemon stops accepting after running out of descriptors.
ACCEPT_PAUSE_S = 0.1
#: Watch list versions run from 1 to this, then start again (gate_closed holds twice one).
MAX_WATCH_VERSION = 2**31 - 1


@dataclass
class Peer:
    """A client connection and the credentials the kernel vouches for (SO_PEERCRED)."""

    conn_id: int
    connection: Connection
    pid: int
    uid: int
    #: Tasks this connection's in-process client feeds with a control block.
    channel_task: int | None = None
    control: ControlBlock | None = None
    owned_tasks: set[int] = field(default_factory=set)
    #: The channel's reply went out: the daemon may push to this connection now.
    channel_ready: bool = False
    #: The control blocks its gate watches, as (task id, connection id) pairs.
    watching: tuple[tuple[int, int], ...] = ()
    #: The version of that list, sent with it (0: none sent yet).
    watch_version: int = 0
    #: Start time of the process that connected (None: it was gone already).
    start_time: int | None = None
    #: Replies and pushes not yet written (set when the peer is accepted).
    outbox: Outbox | None = None
    #: Monotonic time before which its requests are not read (its user sent too many).
    paused_until: float = 0.0
    #: What the selector waits for on its socket now (0: nothing, its requests wait).
    interest: int = selectors.EVENT_READ


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel reports them."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


class Daemon:
    """``gpreempt serve``: owns the runtime directory while it runs."""

    def __init__(
        self,
        runtime_dir: Path,
        *,
        policy: str = "hpf",
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
        self.policy_name = policy
        self.policy: Policy = get_policy(policy)
        #: Length of the turns gated peers below a more important task take (hpf only;
        #: policy/turns.py); 0 = they launch side by side.
        self.turn_ms = turn_ms if policy == "hpf" and turn_ms > 0 else 0.0
        if self.turn_ms:
            self.policy = functools.partial(
                decide_hpf, turns=TurnSettings(turn_ms=turn_ms, budget_ms=inflight_budget_ms)
            )
        self.shared = shared
        self.metrics_port = metrics_port
        self.metrics_addr = metrics_addr
        self.lock_timeout_ms = lock_timeout_ms
        self.inflight_budget_ms = inflight_budget_ms
        self.backstop_ms = backstop_ms
        #: Gates sleep once every more important task on their GPU was idle this long.
        self.sleep_after_s = sleep_after_s
        #: Gates watch the activity of the tasks that outrank them (hpf only; policy/watch.py).
        self.watch = watch and policy == "hpf"
        #: A gate closed only for watched tasks goes on by itself once they are idle.
        self.watch_resume = watch_resume and self.watch
        self._watch_signature: tuple[Any, ...] | None = None
        self.log = log or (lambda message: None)
        self.registry = Registry()
        self.peers: dict[int, Peer] = {}
        self.selector = selectors.DefaultSelector()
        self.policy_memory: Any = None
        self.wake_at: float | None = None
        self.started_at = time.time()
        self._next_conn = 1
        self._stopping = False
        self._last_liveness = 0.0
        self._last_account = time.monotonic()
        self.metrics: Any = None
        #: Set when something changed outside reconcile (a restore): reconcile soon.
        self.dirty = False
        #: What the state file holds now (None: not written yet).
        self._persisted: list[persist.SuspendedRecord] | None = None
        self._attached: list[persist.AttachedRecord] | None = None
        #: Writes of the state files that failed (a full disk), and the last reason.
        self.state_write_failures = 0
        self.last_state_error: str | None = None
        self.limits = limits or Limits(shared=shared)
        self.limits.shared = shared
        #: Which process groups hold only their owner's processes, this scheduling pass.
        self._census = GroupCensus()
        #: Peers with complete requests left in their buffer, or paused by their user's rate.
        self._backlog: dict[int, Peer] = {}
        self._accept_paused_until = 0.0
        self._protected: frozenset[int] = frozenset({1, os.getpid()})

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Take the runtime directory: lock, socket, event log, leftovers of a dead daemon."""
        if self.shared and os.getuid() != 0:
            raise UsageError("--shared serves every user and needs root")
        self.limits.size_for_fd_limit(bounds.raise_fd_limit())
        self._protected = protected_pids()
        self._lock_fd = self._take_lock()
        if self.metrics_port is not None:
            self._start_metrics(self.runtime_dir / LOCK_NAME)

        self.mechanisms = MechanismSet(self.lock_timeout_ms)
        from .memory import MemoryManager

        self.memory = MemoryManager(self)
        self.events = EventLog(self.runtime_dir / EVENTS_NAME)
        self.state_path = self.runtime_dir / STATE_NAME
        self.attached_path = self.runtime_dir / persist.ATTACHED_NAME
        for record, outcome in persist.resume_leftovers(self.state_path):
            self.events.write(
                "resume",
                task=record.name,
                pid=record.pid,
                mechanism=record.mechanism,
                reason=f"left suspended by a previous daemon: {outcome}",
            )
            self.log(f"process {record.pid} ({record.name}) left suspended: {outcome}")

        path = self.runtime_dir / SOCKET_NAME
        self.listener = self._listen()
        self.selector.register(self.listener, selectors.EVENT_READ, ("listen", None))

        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self.backstop = Backstop(self, self.backstop_ms, wake_fd=self._wake_w)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

        self.events.write("daemon-start", reason=f"policy {self.policy_name}", pid=os.getpid())
        self._reattach()
        self.log(f"serving {path} (policy {self.policy_name})")

    def _start_metrics(self, lock_path: Path) -> None:
        """Serve metrics, before anything else is created: a port that cannot be bound
        leaves nothing behind (the lock is released and its file removed)."""
        from .metrics import DaemonMetrics, gpu_uuids

        try:
            self.metrics = DaemonMetrics(gpu_uuids=gpu_uuids())
            self.metrics.start_http(self.metrics_port, self.metrics_addr)
        except BaseException:
            self.metrics = None
            with contextlib.suppress(OSError):
                lock_path.unlink()
            os.close(self._lock_fd)
            raise
        self.log(f"metrics on http://{self.metrics_addr}:{self.metrics.port}/metrics")

    def _take_lock(self) -> int:
        """Check the runtime directory (runtime_dir.py) and take its lock file, never through
        a symlink; record what the directory, lock and socket paths name, to notice when
        they are deleted or replaced."""
        ensure_private_dir(self.runtime_dir, shared=self.shared)
        lock_path = self.runtime_dir / LOCK_NAME
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise UsageError(
                f"cannot open {lock_path}: {exc.strerror or exc} (a symbolic link is never "
                "followed); remove it, or use another --runtime-dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UsageError(f"cannot lock {lock_path}: {exc.strerror}") from None
            raise DaemonAlreadyRunning(
                f"another gpreempt daemon (pid {other}) already serves {self.runtime_dir}; "
                "stop it first, or use another --runtime-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._dir_identity = FileIdentity.of(self.runtime_dir)
        self._lock_identity = FileIdentity.of(lock_path)
        return fd

    def _listen(self) -> socket.socket:
        """Bind the socket (replacing a stale one: we hold the lock) and listen."""
        path = self.runtime_dir / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # stale: we hold the lock, so no live daemon owns it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177 if not self.shared else 0o111)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_umask)
        listener.listen(256)
        listener.setblocking(False)
        self._socket_identity = FileIdentity.of(path)
        return listener

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stopping = True

    def serve_forever(self) -> None:
        try:
            while not self._stopping:
                self._serve_once()
        finally:
            self.shutdown()

    def _serve_once(self) -> None:
        """One turn of the loop: whatever is ready, then the periodic checks. Every step is
        guarded: an error is logged and the daemon goes on."""
        now = time.monotonic()
        timeout = LIVENESS_PERIOD_S
        if self.wake_at is not None:
            timeout = max(0.0, min(timeout, self.wake_at - now))
        if self._backlog:
            ready_at = min(p.paused_until for p in self._backlog.values())
            timeout = max(0.0, min(timeout, ready_at - now))
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._guarded("listen", self._resume_accepting)
        for key, mask in self.selector.select(timeout):
            kind, data = key.data
            self._census = GroupCensus()
            if kind == "peer" and mask & selectors.EVENT_WRITE:
                self._guarded(kind, self._on_writable, data)
                if data.conn_id not in self.peers or not mask & selectors.EVENT_READ:
                    continue
            handler = {
                "listen": self._accept,
                "peer": self._on_readable,
                "doorbell": self._on_doorbell,
                "wake": self._drain_wake,
            }[kind]
            self._guarded(kind, handler, *(() if data is None else (data,)))
        if self._backlog:
            self._census = GroupCensus()
            now = time.monotonic()
            for peer in list(self._backlog.values()):
                if peer.paused_until <= now and peer.conn_id in self.peers:
                    self._guarded("peer", self._serve_backlog, peer)
        now = time.monotonic()
        if now - self._last_liveness >= LIVENESS_PERIOD_S:
            self._last_liveness = now
            self._census = GroupCensus()
            self._guarded("liveness", self._check_liveness)
            self._guarded("runtime directory", self._check_runtime_dir)
        if self.dirty or (self.wake_at is not None and now >= self.wake_at):
            self.dirty = False
            self._census = GroupCensus()
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
                    self._drop_peer(args[0])

    def shutdown(self) -> None:
        """Resume every suspended task, then release the runtime directory. Each step is
        guarded: whatever fails (a full disk, a lost directory), every task is resumed."""
        for task in list(self.registry.tasks.values()):
            task.held = False
            try:
                if task.evicted:
                    try:
                        restored = self.memory.restore(task, reason="daemon stopping")
                    except GpreemptError:
                        restored = False
                    if not restored:
                        self.log(
                            f"{task.name} stays evicted (no room to restore it); restore it "
                            "with `gpreempt restore` under a new daemon"
                        )
                        continue
                if task.suspended:
                    self._resume(task, reason="daemon stopping")
            except Exception as exc:
                self.log(f"error resuming {task.name} on shutdown: {exc!r}")
        for step in (self.backstop.finish, self._persist, self._persist_attached):
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
        path = self.runtime_dir / SOCKET_NAME
        if FileIdentity.of(path) == self._socket_identity:  # never another daemon's socket
            with contextlib.suppress(OSError):
                path.unlink()
        self.listener.close()
        signal.set_wakeup_fd(-1)
        self.events.close()
        if self.metrics is not None:
            self.metrics.stop_http()
        os.close(self._lock_fd)

    # ------------------------------------------------------------------ connections
    def _accept(self) -> None:
        """Accept what is waiting (a bounded number per turn). Out of descriptors, stop
        accepting for a moment rather than spin; over a limit, say so and close."""
        for _ in range(64):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log(f"cannot accept connections for now: {exc.strerror}")
                    self._pause_accepting()
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue
                raise
            self._admit(sock)

    def _pause_accepting(self) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S

    def _resume_accepting(self) -> None:
        self._accept_paused_until = 0.0
        self.selector.register(self.listener, selectors.EVENT_READ, ("listen", None))

    def _admit(self, sock: socket.socket) -> None:
        try:
            pid, uid, _gid = peer_credentials(sock)
        except OSError:
            sock.close()
            return
        per_uid = sum(1 for p in self.peers.values() if p.uid == uid)
        refusal = self.limits.check_connection(uid, per_uid, len(self.peers))
        if refusal is not None:
            with contextlib.suppress(OSError):
                sock.setblocking(False)
                sock.send(encode(error_reply(UsageError(refusal))))
            sock.close()
            return
        sock.setblocking(False)
        try:
            start_time: int | None = read_process(pid).start_time
        except GpreemptError:
            start_time = None
        peer = Peer(self._next_conn, Connection(sock, MAX_MESSAGE), pid, uid)
        peer.start_time = start_time
        peer.outbox = Outbox(sock)
        self._next_conn += 1
        self.peers[peer.conn_id] = peer
        self.selector.register(sock, selectors.EVENT_READ, ("peer", peer))

    def _on_readable(self, peer: Peer) -> None:
        try:
            open_ = peer.connection.feed()
        except ProtocolError as exc:
            self._reply(peer, error_reply(exc))
            self._drop_peer(peer)
            return
        except (BlockingIOError, InterruptedError):
            open_ = True
        except OSError:
            open_ = False
        if not open_:
            # what it sent before closing is still served (a launcher's last words)
            self._serve_backlog(peer)
            self._drop_peer(peer)
            return
        self._serve_backlog(peer)

    def _serve_backlog(self, peer: Peer) -> None:
        """Handle up to MESSAGES_PER_TURN buffered requests of ``peer``, within its user's
        message rate; leave the rest for the next turns, the other clients' first."""
        self._backlog.pop(peer.conn_id, None)
        try:
            self._serve_some(peer)
        finally:
            self._set_interest(peer)

    def _serve_some(self, peer: Peer) -> None:
        for _ in range(bounds.MESSAGES_PER_TURN):
            if peer.conn_id not in self.peers:
                return
            if peer.outbox:
                return  # it reads no replies: read no more of its requests until it does
            if not peer.connection.buffered:
                return
            wait_until = self.limits.allow_message(peer.uid, time.monotonic())
            if wait_until is not None:
                peer.paused_until = wait_until
                self._backlog[peer.conn_id] = peer
                return
            try:
                item = peer.connection.pop()
            except ProtocolError as exc:
                self._reply(peer, error_reply(exc))
                if not getattr(exc, "framing_intact", False):
                    self._drop_peer(peer)
                    return
                continue  # one malformed line: the next one is whole
            if item is None:
                return
            message, fds = item
            reply = self._handle(peer, message, fds)
            self._reply(peer, reply)
            if message.get("op") == "channel" and reply.get("ok"):
                peer.channel_ready = True
                self._update_watches(force=True)
        if peer.conn_id in self.peers and peer.connection.buffered and not peer.outbox:
            peer.paused_until = 0.0
            self._backlog[peer.conn_id] = peer

    def _reply(self, peer: Peer, reply: Message) -> None:
        try:
            data = encode(reply, MAX_REPLY)
        except ProtocolError as exc:
            data = encode(error_reply(exc))
        self._queue(peer, data)

    def _queue(self, peer: Peer, data: bytes, fds: list[int] | None = None) -> None:
        """Send ``data`` (and ``fds``, whose ownership passes here) to ``peer`` without
        blocking: what the socket does not take now waits in its bounded outbox; a peer
        that lets it overflow is dropped."""
        outbox = peer.outbox
        if outbox is None or peer.conn_id not in self.peers:
            for fd in fds or ():
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        if not outbox.put(data, fds or ()):
            self.log(f"dropping client {peer.pid} (uid {peer.uid}): it does not read replies")
            self._drop_peer(peer)
            return
        try:
            done = outbox.flush()
        except OSError:
            return  # gone: dropped when its socket reads as closed
        if not done:
            self._set_interest(peer)

    def _on_writable(self, peer: Peer) -> None:
        assert peer.outbox is not None
        try:
            done = peer.outbox.flush()
        except OSError:
            self._drop_peer(peer)
            return
        if done and peer.connection.buffered:
            self._backlog[peer.conn_id] = peer
        self._set_interest(peer)

    def _set_interest(self, peer: Peer) -> None:
        """What to wait for on ``peer``'s socket: while replies wait, for it to take them
        (reading nothing more: its requests would only add replies); while requests of it
        wait in its buffer (its turn, or its user's rate), for nothing; else for requests."""
        if peer.conn_id not in self.peers:
            return
        if peer.outbox:
            wanted = selectors.EVENT_WRITE
        elif peer.conn_id in self._backlog:
            wanted = 0
        else:
            wanted = selectors.EVENT_READ
        if wanted == peer.interest:
            return
        sock = peer.connection.sock
        with contextlib.suppress(KeyError, ValueError):
            if peer.interest == 0:
                self.selector.register(sock, wanted, ("peer", peer))
            elif wanted == 0:
                self.selector.unregister(sock)
            else:
                self.selector.modify(sock, wanted, ("peer", peer))
        peer.interest = wanted

    def _drop_peer(self, peer: Peer) -> None:
        if self.peers.pop(peer.conn_id, None) is None:
            return
        self._backlog.pop(peer.conn_id, None)
        if peer.interest:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(peer.connection.sock)
        if peer.outbox is not None:
            with contextlib.suppress(OSError):
                peer.outbox.flush()  # a last error reply, if the socket takes it
            peer.outbox.discard()
        changed = False
        if peer.control is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(peer.control.doorbell)
            task = self.registry.tasks.get(peer.channel_task or -1)
            if task is not None:
                task.controls.pop(peer.conn_id, None)
                changed = True
            # gates that watch this block must not wait for a request that will never end
            peer.control.clear_activity()
            peer.control.close()
        for task_id in peer.owned_tasks:
            task = self.registry.tasks.get(task_id)
            if task is not None:
                self._end_task(task, "its launcher disconnected")
                changed = True
        peer.connection.close()
        if changed:
            self.reconcile()

    def _on_doorbell(self, peer: Peer) -> None:
        if peer.control is not None and not peer.control.drain_doorbell():
            self.log(f"dropping client {peer.pid}: its doorbell does not reset")
            self._drop_peer(peer)
            return
        self.reconcile()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass
        if self.backstop.collect():  # a backstop lock finished
            self._persist()

    # ------------------------------------------------------------------ requests
    def _handle(self, peer: Peer, message: Message, fds: list[int]) -> Message:
        op = message.get("op")
        try:
            if op not in OPS:
                raise ProtocolError(f"unknown op {op!r}: expected one of {', '.join(sorted(OPS))}")
            handler = getattr(self, f"_op_{op}")
            return {"ok": True, **handler(peer, message, fds)}
        except bounds.BadField as exc:
            return error_reply(UsageError(f"bad {op!r} request: {exc}"))
        except GpreemptError as exc:
            return error_reply(exc)
        except (TypeError, ValueError, KeyError) as exc:
            return error_reply(ProtocolError(f"bad {op!r} request: {exc}"))
        finally:
            for fd in fds:  # fds a handler did not take (it clears the list when it does)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _op_ping(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        return {"pid": os.getpid(), "policy": self.policy_name}

    def _check_owner(self, peer: Peer, uid: int, what: str) -> None:
        if peer.uid != 0 and peer.uid != uid:
            raise PermissionDenied(
                f"{what} belongs to uid {uid}; you (uid {peer.uid}) may act only on your own "
                "processes"
            )

    def _op_register(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        claimed = bounds.whole(message.get("pid"), "pid", 1, bounds.MAX_PID)
        pid = pid_seen_by_peer(claimed, peer.pid)  # a container names its own
        info = self._registrable(peer, pid)
        existing = self.registry.by_pid(pid)
        if existing is not None:
            raise UsageError(f"process {pid} is already registered as task {existing.name!r}")
        owned = bounds.flag(message.get("owned"), "owned")
        task = self._add_task(peer, info, message, owned=owned)
        if not owned:
            task.attached = True
            self._persist_attached()
        self.reconcile()
        return {"task": task.describe(time.monotonic())}

    def _registrable(self, peer: Peer | None, pid: int) -> Any:
        """The process ``pid``, once checked: not one the daemon must never stop, the
        caller's own (or the caller is root), and one this daemon can act on."""
        info = read_process(pid)
        if peer is not None:
            self._check_owner(peer, info.uid, f"process {pid}")
        if pid in self._protected:
            what = "init" if pid == 1 else "this daemon or one of its ancestors"
            raise PermissionDenied(
                f"process {pid} is {what}: stopping it would stop the daemon; not registered"
            )
        if os.getuid() != 0 and info.uid != os.getuid():
            raise PermissionDenied(
                f"this daemon runs as uid {os.getuid()} and cannot preempt process {pid} of uid "
                f"{info.uid}; run the daemon as root or as that user"
            )
        return info

    def _add_task(self, peer: Peer, info: Any, message: Message, owned: bool) -> Task:
        """Register a task; ``owned``: it ends when this peer's connection closes."""
        self.limits.check_task_count(info.uid, self.registry.count_of(info.uid))
        task = self._new_task(peer, info, message)
        self.registry.add_pidfd(task)
        self.registry.add(task)
        if owned:
            task.owner = peer.conn_id
            peer.owned_tasks.add(task.task_id)
        self.events.write(
            "registered", **task.event_fields(), mechanism=task.mechanism, priority=task.priority
        )
        return task

    def _new_task(self, peer: Peer | None, info: Any, message: Message) -> Task:
        """A task for process ``info`` from the fields of ``message``, each checked for its
        type and range (limits.py); the name escaped and unique among its owner's tasks."""
        given = bounds.text(message.get("name"), "name")
        name = clean_name(given or info.name) or str(info.pid)
        if given and self.registry.name_taken(name, info.uid) is not None:
            taken = self.registry.name_taken(name, info.uid)
            assert taken is not None
            raise UsageError(
                f"you already have a task named {name!r} (pid {taken.pid}); give another name"
            )
        name = self.registry.free_name(name, info.uid)
        raw_gpus = message.get("gpus")
        if raw_gpus is None:
            raw_gpus = [0]
        if not isinstance(raw_gpus, list) or not 1 <= len(raw_gpus) <= MAX_GPUS:
            raise UsageError(f"gpus must be a list of 1 to {MAX_GPUS} GPU indexes")
        gpus = tuple(bounds.whole(g, "a GPU index", 0, bounds.MAX_GPU_INDEX) for g in raw_gpus)
        mechanism = bounds.text(message.get("mechanism"), "mechanism") or "auto"
        chosen = self.mechanisms.get(mechanism)  # refuses mechanisms this machine lacks
        if bounds.flag(message.get("check"), "check"):  # a running process: check it now
            chosen.check(Target(pid=info.pid, start_time=info.start_time))
        timeslice = message.get("timeslice_ms")
        if timeslice is not None:
            low, high = bounds.TIMESLICE_MS_RANGE
            timeslice = bounds.number(timeslice, "--timeslice-ms", low, high)
        min_share = message.get("min_share")
        if min_share is not None:
            min_share = bounds.number(min_share, "--min-share", 0, 1, open_low=True)
        reserve = message.get("reserve_bytes") or 0
        reserve = bounds.whole(reserve, "--reserve-memory", 0, bounds.MAX_RESERVE_BYTES)
        if reserve and self.mechanisms.lock_unavailable:
            raise UsageError(
                "--reserve-memory needs memory eviction, which needs the NVIDIA driver "
                f"checkpoint API, and this daemon has none ({self.mechanisms.lock_unavailable}); "
                "leave --reserve-memory out"
            )
        priority = parse_priority(message.get("priority", 0))
        if peer is not None:
            self.limits.check_priority(peer.uid, priority)
        return Task(
            task_id=self.registry.new_id(),
            pid=info.pid,
            # A process leading its own group (a shell job, a `gpreempt run` child) is
            # preempted with its whole group, so helpers such as DataLoader workers stop too.
            pgid=info.pgid if info.pgid == info.pid else None,
            start_time=info.start_time,
            uid=info.uid,
            name=name,
            priority=priority,
            gpus=gpus,
            mechanism=mechanism,
            always_active=bounds.flag(message.get("always_active"), "always_active"),
            timeslice_ms=timeslice,
            min_share=min_share,
            reserve_bytes=reserve,
        )

    def _op_channel(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        """Bind the caller's control block to its task (registering the caller if asked).

        The caller is the process that connected, checked again now: its pid must still
        name the same process (start time) of the same user (SO_PEERCRED), so that a
        recycled pid registers nobody else's process."""
        if len(fds) != 2:
            raise ProtocolError("a channel request carries exactly two fds: memfd and eventfd")
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
        task = self._task_of(peer.pid)
        if task is not None and peer.uid not in (0, task.uid):
            raise PermissionDenied(
                f"process {peer.pid} runs under task {task.name!r} of uid {task.uid}; "
                f"you (uid {peer.uid}) may feed only your own tasks"
            )
        register = message.get("register")
        if task is None and not register:
            raise NoSuchProcess(
                f"process {peer.pid} is not part of a registered task; start it with "
                "`gpreempt run` or pass register=True with a priority"
            )
        if task is None and not isinstance(register, dict):
            raise UsageError("register must be an object of task fields")
        try:
            control = ControlBlock.adopt(fds[0], fds[1])
        except ValueError as exc:
            raise ProtocolError(f"bad channel: {exc}") from None
        fds.clear()  # the control block owns them now
        try:
            if task is None:
                info = self._registrable(peer, peer.pid)
                task = self._add_task(peer, info, {**register, "pid": peer.pid}, owned=True)
        except BaseException:
            control.close()
            raise
        peer.control = control
        peer.channel_task = task.task_id
        task.controls[peer.conn_id] = control
        self.selector.register(control.doorbell, selectors.EVENT_READ, ("doorbell", peer))
        if task.suspended and task.suspended_with == "gate":
            control.set_gate(True)
        control.set_window_share(task.window_share_ms)
        control.set_sleep_ok(task.sleep_ok)
        self.reconcile()
        return {
            "task_id": task.task_id,
            "name": task.name,
            "priority": task.priority,
            "mechanism": task.mechanism,
        }

    def _task_of(self, pid: int) -> Task | None:
        """The task whose process is ``pid`` or an ancestor of it."""
        direct = self.registry.by_pid(pid)
        if direct is not None:
            return direct
        for task in self.registry.tasks.values():
            if is_descendant(pid, task.pid):
                return task
        return None

    def _op_status(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        now = time.monotonic()
        watched = self._watched_by_task()
        return {
            "daemon": {
                "pid": os.getpid(),
                "policy": self.policy_name,
                "turn_ms": self.turn_ms,
                "runtime_dir": str(self.runtime_dir),
                "started_at": self.started_at,
                "lock_available": self.mechanisms.lock_unavailable is None,
                "lock_unavailable_reason": self.mechanisms.lock_unavailable,
                "connections": len(self.peers),
                # writes that failed (a full disk): counted, never fatal
                "event_write_failures": self.events.failed,
                "state_write_failures": self.state_write_failures,
                "last_write_error": self.last_state_error or self.events.last_error,
            },
            "tasks": [
                {**t.describe(now), "watching": watched.get(t.task_id, [])}
                for t in self.registry.tasks.values()
            ],
        }

    def _watched_by(self, task: Task) -> list[int]:
        """Ids of the tasks whose blocks the gates of ``task`` watch (policy/watch.py)."""
        return self._watched_by_task().get(task.task_id, [])

    def _watched_by_task(self) -> dict[int, list[int]]:
        """For each task, the ids of the tasks whose blocks its gates watch (policy/watch.py)."""
        ids: dict[int, set[int]] = {}
        for peer in self.peers.values():
            if peer.channel_task is not None and peer.watching:
                ids.setdefault(peer.channel_task, set()).update(h for h, _c in peer.watching)
        return {task_id: sorted(found) for task_id, found in ids.items()}

    def _target_task(self, peer: Peer, message: Message) -> Task:
        """The task a hold/evict/restore/detach request names (pid first, then the caller's
        own names), once the caller is checked to own it."""
        target = message.get("target")
        if isinstance(target, bool) or not isinstance(target, (str, int)):
            raise UsageError("target must be a task name or pid")
        task = self.registry.find(str(target), uid=peer.uid)
        self._check_owner(peer, task.uid, f"task {task.name!r}")
        return task

    def _op_hold(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        task = self._target_task(peer, message)
        hold = bounds.flag(message.get("hold"), "hold")
        if task.held != hold:
            task.held = hold
            self.events.write(
                "hold" if hold else "release",
                **task.event_fields(),
                reason=f"by uid {peer.uid} (pid {peer.pid})",
            )
            self.reconcile()
        return {"task": task.describe(time.monotonic())}

    def _op_detach(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        """Unregister a task: resumed first, then forgotten (its process goes on unmanaged)."""
        task = self._target_task(peer, message)
        if task.evicted and not self.memory.restore(task, reason="detach"):
            raise UsageError(
                f"task {task.name!r} is evicted and there is no room to restore it yet; "
                "try again later"
            )
        described = task.describe(time.monotonic())
        self._end_task(task, f"detached by uid {peer.uid}")
        for other in self.peers.values():
            other.owned_tasks.discard(task.task_id)
        self.reconcile()
        return {"task": described}

    def _op_evict(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        task = self._target_task(peer, message)
        self.memory.evict(task, reason=f"by uid {peer.uid}")
        return {"task": task.describe(time.monotonic())}

    def _op_restore(self, peer: Peer, message: Message, fds: list[int]) -> dict[str, Any]:
        task = self._target_task(peer, message)
        if not self.memory.restore(task, reason=f"by uid {peer.uid}"):
            return {"task": task.describe(time.monotonic()), "pending": True}
        self.reconcile()
        return {"task": task.describe(time.monotonic()), "pending": False}

    # ------------------------------------------------------------------ scheduling
    def _end_task(self, task: Task, reason: str) -> None:
        task.held = False
        if task.suspended:
            self._resume(task, reason=f"task ended: {reason}")
        self.registry.remove(task.task_id)
        self.events.write("exit", **task.event_fields(), reason=reason)
        if self.metrics is not None:
            left = [(gpu, t.name) for t in self.registry.tasks.values() for gpu in t.gpus]
            for gpu in task.gpus:
                self.metrics.on_task_end(gpu, task.name, left)
        if task.attached:
            self._persist_attached()

    def _check_liveness(self) -> None:
        if self.memory.needed():
            self.memory.enforce_reserves()
        changed = False
        for task in list(self.registry.tasks.values()):
            if not alive(task.pid, task.start_time):
                self._end_task(task, "process exited")
                changed = True
        if changed:
            self.reconcile()
        self._publish_states()

    def _account(self, now: float) -> None:
        """Advance each task's run time (active and not suspended) for time-based policies."""
        elapsed = now - self._last_account
        self._last_account = now
        for task in self.registry.tasks.values():
            if task.was_active and not task.suspended:
                task.run_seconds += elapsed

    def snapshot(self, now: float) -> Snapshot:
        return Snapshot(now=now, tasks=tuple(t.view(now) for t in self.registry.tasks.values()))

    def reconcile(self) -> None:
        """Ask the policy, then suspend and resume whatever differs from its answer."""
        now = time.monotonic()
        # Gates close before anything is written: the log waits, the waiting task does not.
        with self.events.batch():
            self._account(now)
            for task in self.registry.tasks.values():
                active = task.active
                if active or task.was_active:
                    task.last_active = now
                if active != task.was_active:
                    task.was_active = active
                    self.events.write(
                        "active" if active else "idle",
                        **task.event_fields(),
                    )
            snapshot = self.snapshot(now)
            decision: Decision = self.policy(snapshot, self.policy_memory)
            self.policy_memory = decision.memory
            held = {t.task_id for t in self.registry.tasks.values() if t.held}
            wanted = set(decision.suspend) | held
            changed = False
            # Suspend first: a more important task is waiting for these.
            for task in sorted(self.registry.tasks.values(), key=lambda t: t.priority):
                turn = task.task_id in decision.turns and not task.held
                if task.task_id in wanted and not task.suspended:
                    changed |= self._suspend(task, "turn" if turn else None)
                if task.suspended and not turn:
                    task.preempted_since = task.preempted_since or now
                else:
                    task.preempted_since = None
                task.waiting_turn = task.suspended and turn
            for task in list(self.registry.tasks.values()):
                if task.task_id not in wanted and task.suspend_error is not None:
                    task.suspend_error = None  # no longer unprotected: nothing to stop
                    changed = True
                if task.task_id not in wanted and task.suspended and not task.evicted:
                    changed |= self._resume(task, reason="policy")
            if changed:
                self._persist()
                self._publish_states()
        self._share_inflight_budget(snapshot)
        sleep_due = self._let_gates_sleep(snapshot)
        self._update_watches(snapshot)
        self._close_while_watched(snapshot, decision)
        self.backstop.apply(now)
        due = [t for t in (decision.wake_at, self.backstop.next_due(), sleep_due) if t is not None]
        self.wake_at = min(due) if due else None
        if self.memory.needed():
            self.memory.enforce_reserves()

    def _share_inflight_budget(self, snapshot: Snapshot) -> None:
        """Tell each gate its share of its GPU's in-flight budget (changes only)."""
        shares = inflight_shares(snapshot, self.inflight_budget_ms, turns=self.turn_ms > 0)
        for task in self.registry.tasks.values():
            share = shares.get(task.task_id)
            if share != task.window_share_ms:
                task.window_share_ms = share
                for control in task.controls.values():
                    control.set_window_share(share)

    def _let_gates_sleep(self, snapshot: Snapshot) -> float | None:
        """Tell each gate whether it may sleep (changes only; hpf only, policy/sleep.py);
        returns when another may."""
        if self.policy_name == "hpf":
            allowed, due = sleepers(snapshot, self.sleep_after_s)
        else:
            allowed, due = frozenset(), None
        for task in self.registry.tasks.values():
            ok = task.task_id in allowed
            if ok != task.sleep_ok:
                task.sleep_ok = ok
                for control in task.controls.values():
                    control.set_sleep_ok(ok)
        return due

    def _update_watches(self, snapshot: Snapshot | None = None, force: bool = False) -> None:
        """Send each gated connection the control blocks of the tasks that outrank it, when
        that set changes: read-only, and only between tasks of the same user. ``snapshot``:
        the registry's, if the caller just took one."""
        tasks = self.registry.tasks.values()
        signature = tuple(
            (t.task_id, t.priority, t.gpus, t.held, t.uid, tuple(t.controls)) for t in tasks
        )
        if signature == self._watch_signature and not force:
            return
        self._watch_signature = signature
        if not self.watch:
            lists: dict[int, frozenset[int]] = {}
        else:
            lists = watch_lists(snapshot or self.snapshot(time.monotonic()))
        for peer in list(self.peers.values()):
            low = self.registry.tasks.get(peer.channel_task or -1)
            if not peer.channel_ready or low is None:
                continue
            blocks: list[tuple[int, int, ControlBlock]] = []
            for high_id in sorted(lists.get(low.task_id, ())):
                high = self.registry.tasks.get(high_id)
                if high is None or high.uid != low.uid:
                    continue  # another user's activity is not this one's to read
                blocks += [(high_id, conn, c) for conn, c in sorted(high.controls.items())]
            blocks = blocks[:MAX_FDS]  # beyond that, the daemon's own closing still applies
            key = tuple((high_id, conn) for high_id, conn, _c in blocks)
            if key != peer.watching:
                peer.watch_version = peer.watch_version % MAX_WATCH_VERSION + 1
                self._send_watch(peer, blocks)
                peer.watching = key

    def _close_while_watched(self, snapshot: Snapshot, decision: Decision) -> None:
        """Let each suspended gate whose only reason to wait is the activity of tasks it
        watches go on by itself once they are idle (policy/watch.py); close every other
        suspended gate plainly. Changes only."""
        tasks = self.registry.tasks
        waits = waited_for(snapshot, decision.until_idle) if self.watch_resume else {}
        for task in tasks.values():
            free = (
                task.suspended
                and not task.held
                and not task.evicted
                and task.mechanism in ("gate", "auto")
            )
            causes = [tasks.get(i) for i in waits.get(task.task_id, ())] if free else []
            for conn, control in task.controls.items():
                word = control.gate_word
                if word == 0:
                    continue  # open, or not this mechanism's to close
                peer = self.peers.get(conn)
                version = peer.watch_version if peer is not None and causes else 0
                if version and all(self._watches_all_of(peer, high) for high in causes):
                    if word != closed_while_watched(version):
                        control.close_while_watched(version)
                elif word != CLOSED:
                    control.set_gate(True)

    @staticmethod
    def _watches_all_of(peer: Peer, high: Task | None) -> bool:
        """Whether ``peer``'s gate reads every word that makes ``high`` active."""
        return (
            high is not None
            and not high.always_active
            and bool(high.controls)
            and all((high.task_id, conn) in peer.watching for conn in high.controls)
        )

    def _send_watch(self, peer: Peer, blocks: list[tuple[int, int, ControlBlock]]) -> None:
        """Push ``peer`` its watch list with read-only descriptors of the blocks, through its
        outbox (the descriptors go with the message, whenever the client reads it)."""
        fds: list[int] = []
        try:
            fds = [control.read_only_fd() for _t, _c, control in blocks]
            owners = [self.peers.get(conn) for _t, conn, _b in blocks]
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
            self.log(f"cannot send the watch list to process {peer.pid}: {exc}")
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        self._queue(peer, data, fds)

    def _suspend(self, task: Task, reason: str | None = None) -> bool:
        """Suspend ``task`` by its mechanism; ``reason`` for the event log (default: held or
        policy)."""
        mechanism = self.mechanisms.get(task.mechanism)
        target = self._target(task)
        start = time.perf_counter()
        try:
            used = mechanism.suspend(target)
        except NoSuchProcess:
            return False
        except GpreemptError as exc:
            if task.mechanism != "auto":
                return self._suspend_failed(task, task.mechanism, exc)
            try:
                used = self.mechanisms.get("signal").suspend(target)
            except NoSuchProcess:
                return False
            except GpreemptError as fallback:
                return self._suspend_failed(task, "signal", fallback)
        latency_ms = (time.perf_counter() - start) * 1e3
        task.suspend_error = None
        task.suspended = True
        task.suspended_with = used
        task.suspended_since = time.monotonic()
        turn = reason == "turn"
        if turn:
            task.turns += 1
        else:
            task.preemptions += 1
        task.last_suspend_ms = round(latency_ms, 4)
        self.events.write(
            "suspend",
            **task.event_fields(),
            mechanism=used,
            latency_ms=latency_ms,
            reason=reason or ("held" if task.held else "policy"),
        )
        if self.metrics is not None and turn:
            self.metrics.on_turn(task.gpu, task.name)
        elif self.metrics is not None:
            self.metrics.on_suspend(task.gpu, task.name, used, latency_ms / 1e3)
        return True

    def _suspend_failed(self, task: Task, mechanism: str, exc: Exception) -> bool:
        """Record that the policy wants ``task`` suspended and ``mechanism`` failed: its state
        becomes ``unprotected`` (status, top, metrics) until a suspension succeeds or the
        policy no longer wants it. The event log gets one line per new reason, not one per
        retry. Returns whether the task's state changed."""
        reason = f"suspend failed: {exc}"
        if self.metrics is not None:
            self.metrics.on_suspend_failed(task.gpu, task.name, mechanism)
        if task.suspend_error == reason:
            return False
        task.suspend_error = reason
        self.events.write("error", **task.event_fields(), mechanism=mechanism, reason=reason)
        self.log(f"{task.name} (pid {task.pid}) is unprotected: {reason}")
        return True

    def _resume(self, task: Task, reason: str) -> bool:
        used = task.suspended_with or "signal"
        start = time.perf_counter()
        self.backstop.release(task)
        try:
            self.mechanisms.concrete[used].resume(self._target(task))
        except NoSuchProcess:
            pass
        except GpreemptError as exc:
            self.events.write(
                "error",
                **task.event_fields(),
                mechanism=used,
                reason=f"resume failed: {exc}",
            )
            return False
        latency_ms = (time.perf_counter() - start) * 1e3
        suspended_for = time.monotonic() - (task.suspended_since or time.monotonic())
        task.suspended_seconds += suspended_for
        task.suspended = False
        task.suspended_since = None
        task.preempted_since = None
        task.waiting_turn = False
        self.events.write(
            "resume",
            **task.event_fields(),
            mechanism=used,
            latency_ms=latency_ms,
            reason=reason,
            suspended_ms=round(suspended_for * 1e3, 4),
        )
        if self.metrics is not None:
            self.metrics.on_resume(task.gpu, task.name, suspended_for)
        return True

    def _target(self, task: Task) -> Target:
        """What the mechanisms act on: the task's whole group only if every member belongs to
        its owner (a root daemon could otherwise stop a root process in a user's job), else
        its process alone; signals go to the process that started at its start time."""
        whole = task.pgid is None or os.geteuid() != 0
        if not whole:
            assert task.pgid is not None
            whole = self._census.owned_by(task.pgid, task.uid)
        return task.target(whole_group=whole)

    def _persist(self) -> None:
        """Record what a successor must resume if this daemon dies, when that changes.

        Tasks held by their gate alone are left out: their client reopens its own gate when
        the daemon goes away. So the many short gate preemptions cost no write here.
        """
        records = [
            persist.SuspendedRecord(
                pid=t.pid,
                pgid=t.pgid,
                start_time=t.start_time,
                mechanism="evict"
                if t.evicted
                else ("lock" if t.backstop_locked else (t.suspended_with or "signal")),
                name=t.name,
            )
            for t in self.registry.tasks.values()
            if t.evicted or (t.suspended and (t.suspended_with != "gate" or t.backstop_locked))
        ]
        if records != self._persisted and self._save(self.state_path, records):
            self._persisted = records

    def _save(self, path: Path, records: list[Any]) -> bool:
        """Write a state file; a failure (a full disk) is counted and shown, never fatal."""
        try:
            persist.save(path, records)
        except OSError as exc:
            self.state_write_failures += 1
            self.last_state_error = f"cannot write {path}: {exc.strerror or exc}"
            self.log(self.last_state_error)
            return False
        return True

    def _persist_attached(self) -> None:
        """Record the tasks registered with ``attach`` for a restarted daemon, when they change."""
        records = [
            persist.AttachedRecord(
                pid=t.pid,
                start_time=t.start_time,
                uid=t.uid,
                name=t.name,
                priority=t.priority,
                gpus=list(t.gpus),
                mechanism=t.mechanism,
                always_active=t.always_active,
                timeslice_ms=t.timeslice_ms,
                min_share=t.min_share,
                reserve_bytes=t.reserve_bytes,
            )
            for t in self.registry.tasks.values()
            if t.attached
        ]
        if records != self._attached and self._save(self.attached_path, records):
            self._attached = records

    def _reattach(self) -> None:
        """Register again the tasks a previous daemon had from ``attach``: each only if its
        pid still names the same process (start time) of the same user."""
        for record in persist.load_attached(self.attached_path):
            try:
                info = self._registrable(None, record.pid)
                if info.start_time != record.start_time or info.uid != record.uid:
                    continue
                if self.registry.by_pid(record.pid) is not None:
                    continue
                fields = {
                    "name": record.name,
                    "priority": record.priority,
                    "gpus": record.gpus,
                    "mechanism": record.mechanism,
                    "always_active": record.always_active,
                    "timeslice_ms": record.timeslice_ms,
                    "min_share": record.min_share,
                    "reserve_bytes": record.reserve_bytes,
                }
                task = self._new_task(None, info, fields)
            except (GpreemptError, ValueError, TypeError) as exc:
                self.log(f"not registering attached process {record.pid} again: {exc}")
                continue
            task.attached = True
            self.registry.add_pidfd(task)
            self.registry.add(task)
            self.events.write(
                "registered",
                **task.event_fields(),
                mechanism=task.mechanism,
                priority=task.priority,
                reason="attached under a previous daemon",
            )
        self._persist_attached()
        self.dirty = True

    def _check_runtime_dir(self) -> None:
        """Notice a runtime directory deleted or replaced under the daemon: take it again if
        no other daemon did (the same clients find it where they look), else resume every
        task and stop, so that two daemons never split the node."""
        socket_path = self.runtime_dir / SOCKET_NAME
        if (
            FileIdentity.of(self.runtime_dir) == self._dir_identity
            and FileIdentity.of(self.runtime_dir / LOCK_NAME) == self._lock_identity
            and FileIdentity.of(socket_path) == self._socket_identity
        ):
            return
        self.log(f"runtime directory {self.runtime_dir} was deleted or replaced")
        try:
            lock_fd = self._take_lock()
        except GpreemptError as exc:
            self.log(f"cannot take it again ({exc}); resuming every task and stopping")
            self._stopping = True
            return
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
        self._lock_fd = lock_fd
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self.listener.close()
        self._accept_paused_until = 0.0
        self.listener = self._listen()
        self.selector.register(self.listener, selectors.EVENT_READ, ("listen", None))
        self.events.reopen()
        self._persisted = None
        self._attached = None
        self._persist()
        self._persist_attached()
        self.events.write("daemon-start", reason="runtime directory recreated", pid=os.getpid())
        self.log(f"recreated {self.runtime_dir} and serving again")

    def _publish_states(self) -> None:
        if self.metrics is None:
            return
        from .metrics import TaskSample

        self.metrics.publish(
            [
                TaskSample(
                    gpu=gpu,
                    task=task.name,
                    state=task.state,
                    suspended_seconds=task.suspended_seconds,
                    suspended_since=task.suspended_since if task.suspended else None,
                )
                for task in self.registry.tasks.values()
                for gpu in task.gpus
            ]
        )
