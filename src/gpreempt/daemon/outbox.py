"""What the daemon still has to write to one client, written without ever blocking the loop.

The daemon serves every client from one thread, so a client that stops reading must not be
able to make it wait: replies and pushes go into a per-client queue that the loop writes as
the socket takes them (``EVENT_WRITE``). The queue is bounded: a client that lets more than
:data:`MAX_QUEUED_BYTES` pile up (beyond the one message it is being sent) is dropped, and
while anything waits for it the daemon reads no further requests from it, so a client that
sends requests without reading the replies only slows itself down.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
from collections import deque
from collections.abc import Sequence

#: Bytes that may wait for one client on top of the message being written to it. A
#: ``status`` reply of any size is always accepted by an empty queue.
MAX_QUEUED_BYTES = 1 << 20
#: Descriptors that may wait for one client (watch lists carry one per watched block): a
#: client that never reads must not make the daemon hold descriptors without bound.
MAX_QUEUED_FDS = 256


class Outbox:
    """A bounded queue of messages (bytes and the descriptors that go with them) for one
    non-blocking socket. Owns the descriptors handed to :meth:`put` and closes them once sent
    or discarded."""

    def __init__(
        self, sock: socket.socket, limit: int = MAX_QUEUED_BYTES, fd_limit: int = MAX_QUEUED_FDS
    ) -> None:
        self.sock = sock
        self.limit = limit
        self.fd_limit = fd_limit
        self._items: deque[tuple[memoryview, list[int]]] = deque()
        self.queued = 0
        #: Descriptors queued (owned here until sent or discarded).
        self.fds = 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(self, data: bytes, fds: Sequence[int] = ()) -> bool:
        """Queue a message; False (and ``fds`` closed) if the client let too much pile up."""
        if self._items and (
            self.queued + len(data) > self.limit or self.fds + len(fds) > self.fd_limit
        ):
            _close_all(fds)
            return False
        self._items.append((memoryview(data), list(fds)))
        self.queued += len(data)
        self.fds += len(fds)
        return True

    def flush(self) -> bool:
        """Write what the socket takes now; True once nothing is left. Raises OSError (other
        than would-block) when the client is gone."""
        while self._items:
            data, fds = self._items[0]
            try:
                if fds:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    sent = self.sock.sendmsg([data], rights)
                    _close_all(fds)  # they went with the first byte
                    self.fds -= len(fds)
                    fds.clear()
                else:
                    sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                return False
            self.queued -= sent
            if sent < len(data):
                self._items[0] = (data[sent:], fds)
                return False
            self._items.popleft()
        return True

    def discard(self) -> None:
        """Forget everything queued (the client is being dropped)."""
        for _data, fds in self._items:
            _close_all(fds)
        self._items.clear()
        self.queued = 0
        self.fds = 0


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
