"""One client connection as the daemon keeps it, with the credentials the kernel vouches for."""

from __future__ import annotations

import selectors
import socket
import struct
from dataclasses import dataclass, field

from ..control_block import ControlBlock
from ..protocol import Connection
from .outbox import Outbox


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
    #: Descriptors the daemon holds for this connection, as last counted (connections.py).
    fds_counted: int = 0
    #: The GPUs its control block said its process made a context on, as last looked at.
    devices_seen: frozenset[int] = frozenset()

    def fds_held(self) -> int:
        """Descriptors the daemon holds for this connection now: its socket, its control
        block and doorbell, descriptors received and not yet claimed, and those queued for it."""
        queued = self.outbox.fds if self.outbox is not None else 0
        block = 2 if self.control is not None else 0
        return 1 + block + self.connection.fds_held + queued


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel reports them."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)
