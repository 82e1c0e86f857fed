"""The daemon's client connections: accepted, read, answered and dropped without blocking.

Each connection is a :class:`~gpreempt.daemon.peer.Peer` whose credentials the kernel vouches
for. Requests are read at most ``MESSAGES_PER_TURN`` at a time and within their user's message
rate; replies and pushes go out through the peer's bounded outbox, and while any wait, no
further request of that peer is read. The descriptors held for each user (sockets, control
blocks, descriptors received or queued) are counted and capped, root's too: a peer that
takes its user over the cap is dropped. A peer that closes ends the tasks it owns.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import time
from collections.abc import Callable

from ..errors import GpreemptError, ProtocolError, UsageError
from ..procinfo import can_use_gpu, read_process
from ..protocol import MAX_MESSAGE, MAX_REPLY, Connection, Message, encode, error_reply
from . import limits as bounds
from .limits import Limits
from .outbox import Outbox
from .peer import Peer, peer_credentials
from .registry import Registry
from .task import Task

#: How long the daemon stops accepting after running out of descriptors.
ACCEPT_PAUSE_S = 0.1


class Connections:
    """The listening socket's clients, served from the daemon's loop."""

    def __init__(
        self,
        selector: selectors.BaseSelector,
        limits: Limits,
        registry: Registry,
        *,
        handle: Callable[[Peer, Message, list[int]], Message],
        on_channel: Callable[[], None],
        on_change: Callable[[], None],
        end_task: Callable[[Task, str], None],
        log: Callable[[str], None],
    ) -> None:
        self.selector = selector
        self.limits = limits
        self.registry = registry
        #: Answers one request (handlers.py).
        self.handle = handle
        #: Called once a channel's reply went out: its watch list may follow.
        self.on_channel = on_channel
        #: Called when a dropped connection changed the tasks: a scheduling pass is due.
        self.on_change = on_change
        self.end_task = end_task
        self.log = log
        self.peers: dict[int, Peer] = {}
        #: Peers with complete requests left in their buffer, or paused by their user's rate.
        self.backlog: dict[int, Peer] = {}
        self.listener: socket.socket | None = None
        self.accept_paused_until = 0.0
        self._next_conn = 1
        #: Descriptors held for each uid's connections (Peer.fds_held, summed).
        self.fds_by_uid: dict[int, int] = {}

    def accept(self) -> None:
        """Accept what is waiting (a bounded number per turn). Out of descriptors, stop
        accepting for a moment rather than spin; over a limit, say so and close."""
        assert self.listener is not None
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
        assert self.listener is not None
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.listener)
        self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S

    def resume_accepting(self) -> None:
        assert self.listener is not None
        self.accept_paused_until = 0.0
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
        self._count_fds(peer)

    def _count_fds(self, peer: Peer) -> bool:
        """Count again the descriptors held for ``peer``; False (the caller drops it) if
        that takes its user over the per-user cap."""
        held = peer.fds_held() if peer.conn_id in self.peers else 0
        total = self.fds_by_uid.get(peer.uid, 0) + held - peer.fds_counted
        peer.fds_counted = held
        if total > 0:
            self.fds_by_uid[peer.uid] = total
        else:
            self.fds_by_uid.pop(peer.uid, None)
        return total <= self.limits.fds_per_uid or held <= 3

    def _over_fd_cap(self, peer: Peer) -> bool:
        """Count ``peer``'s descriptors; over its user's cap, say so (if its socket takes the
        line now), drop it and return True."""
        if self._count_fds(peer):
            return False
        self.log(f"dropping client {peer.pid} (uid {peer.uid}): its user holds too many fds")
        refusal = UsageError(
            f"uid {peer.uid} makes the daemon hold more than {self.limits.fds_per_uid} "
            "descriptors (the limit per user)"
        )
        with contextlib.suppress(OSError):
            peer.connection.sock.send(encode(error_reply(refusal)))
        self.drop_peer(peer)
        return True

    def on_readable(self, peer: Peer) -> None:
        try:
            open_ = peer.connection.feed()
        except ProtocolError as exc:
            self._reply(peer, error_reply(exc))
            self.drop_peer(peer)
            return
        except (BlockingIOError, InterruptedError):
            open_ = True
        except OSError:
            open_ = False
        if self._over_fd_cap(peer):
            return
        if not open_:
            # what it sent before closing is still served (a launcher's last words)
            self.serve_backlog(peer)
            self.drop_peer(peer)
            return
        self.serve_backlog(peer)

    def serve_backlog(self, peer: Peer) -> None:
        """Handle up to MESSAGES_PER_TURN buffered requests of ``peer``, within its user's
        message rate; leave the rest for the next turns, the other clients' first."""
        self.backlog.pop(peer.conn_id, None)
        try:
            self._serve_some(peer)
        finally:
            self._set_interest(peer)
            self._count_fds(peer)

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
                self.backlog[peer.conn_id] = peer
                return
            try:
                item = peer.connection.pop()
            except ProtocolError as exc:
                self._reply(peer, error_reply(exc))
                if not getattr(exc, "framing_intact", False):
                    self.drop_peer(peer)
                    return
                continue  # one malformed line: the next one is whole
            if item is None:
                return
            message, fds = item
            reply = self.handle(peer, message, fds)
            self._reply(peer, reply)
            if message.get("op") == "channel" and reply.get("ok"):
                peer.channel_ready = True
                self.on_channel()
        if peer.conn_id in self.peers and peer.connection.buffered and not peer.outbox:
            peer.paused_until = 0.0
            self.backlog[peer.conn_id] = peer

    def _reply(self, peer: Peer, reply: Message) -> None:
        try:
            data = encode(reply, MAX_REPLY)
        except ProtocolError as exc:
            data = encode(error_reply(exc))
        self.send(peer, data)

    def send(self, peer: Peer, data: bytes, fds: list[int] | None = None) -> None:
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
            self.drop_peer(peer)
            return
        try:
            done = outbox.flush()
        except OSError:
            return  # gone: dropped when its socket reads as closed
        finally:
            if peer.conn_id in self.peers:
                self._over_fd_cap(peer)
        if not done and peer.conn_id in self.peers:
            self._set_interest(peer)

    def on_writable(self, peer: Peer) -> None:
        assert peer.outbox is not None
        try:
            done = peer.outbox.flush()
        except OSError:
            self.drop_peer(peer)
            return
        if done and peer.connection.buffered:
            self.backlog[peer.conn_id] = peer
        self._set_interest(peer)
        self._count_fds(peer)

    def _set_interest(self, peer: Peer) -> None:
        """What to wait for on ``peer``'s socket: while replies wait, for it to take them
        (reading nothing more: its requests would only add replies); while requests of it
        wait in its buffer (its turn, or its user's rate), for nothing; else for requests."""
        if peer.conn_id not in self.peers:
            return
        if peer.outbox:
            wanted = selectors.EVENT_WRITE
        elif peer.conn_id in self.backlog:
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

    def drop_peer(self, peer: Peer) -> None:
        if self.peers.pop(peer.conn_id, None) is None:
            return
        self._count_fds(peer)  # no longer held: its count goes
        self.backlog.pop(peer.conn_id, None)
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
                task.drop_rank(peer.conn_id)
                changed = True
            # gates that watch this block must not wait for a request that will never end
            peer.control.clear_activity()
            peer.control.close()
        for task_id in peer.owned_tasks:
            task = self.registry.tasks.get(task_id)
            if task is not None:
                self.end_task(task, "its launcher disconnected")
                changed = True
        peer.connection.close()
        if changed:
            self.on_change()

    def on_doorbell(self, peer: Peer) -> None:
        if peer.control is not None and not peer.control.drain_doorbell():
            self.log(f"dropping client {peer.pid}: its doorbell does not reset")
            self.drop_peer(peer)
            return
        note_devices(peer, self.registry, self.log)
        self.on_change()

    def listen_to_doorbell(self, peer: Peer) -> None:
        """Wake the loop when ``peer``'s client rings its doorbell (its activity changed, or
        its process made a context on another GPU); a block that already names GPUs (a client
        that reconnected) counts them at once."""
        assert peer.control is not None
        self.selector.register(peer.control.doorbell, selectors.EVENT_READ, ("doorbell", peer))
        note_devices(peer, self.registry, self.log)


def note_devices(peer: Peer, registry: Registry, log: Callable[[str], None]) -> None:
    """Count ``peer``'s task on the GPUs its process made a CUDA context on since the last
    look (its driver-level gate writes them and rings): a process that drives several GPUs is
    preempted by a more important task on any of them. Only those its process can use count:
    a client cannot put its task where it cannot run."""
    if peer.control is None:
        return
    new = peer.control.devices - peer.devices_seen
    task = registry.tasks.get(peer.channel_task or -1)
    if not new or task is None:
        return
    peer.devices_seen |= new
    for gpu in sorted(new):
        if can_use_gpu(peer.pid, gpu) and task.add_gpu(gpu, peer.conn_id):
            log(f"task {task.name}: its process {peer.pid} uses GPU {gpu} too")
