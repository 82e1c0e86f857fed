"""The daemon's wire format: one JSON object per line on a unix stream socket.

A request is ``{"op": <name>, ...}``; a reply is ``{"ok": true, ...}`` or
``{"ok": false, "error": <message>, "kind": <error class>}``. A client's control block
(shared memory) and doorbell (eventfd) travel as file descriptors (SCM_RIGHTS) beside
the ``channel`` request, and the daemon's watch lists beside its ``watch`` pushes. A message
that carries descriptors says how many (``"nfds"``): one read from a stream socket can return
the bytes of two messages with the second one's descriptors, and they must go to the second.
Requests are capped at :data:`MAX_MESSAGE` bytes so a peer cannot make the daemon buffer
without bound; replies (``status`` of a thousand tasks is about a megabyte) at
:data:`MAX_REPLY`. Numbers must be finite: ``NaN`` and ``Infinity`` are refused with a reply.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
from collections.abc import Sequence
from typing import Any

from .errors import BY_NAME, DaemonUnavailable, ProtocolError, RemoteError

MAX_MESSAGE = 64 * 1024
#: Largest message a client accepts from the daemon (its replies and pushes).
MAX_REPLY = 64 * 2**20
MAX_FDS = 4
#: Descriptors a connection may have received and not yet claimed by a message: a peer that
#: sends more (descriptors with bytes that never end a message) is dropped, so that no client
#: can make the other end hold descriptors without bound.
MAX_PENDING_FDS = 4 * MAX_FDS

#: Operations the daemon understands; anything else is refused with a clear error.
OPS = frozenset(
    {
        "register",  # a task: pid, name, priority, gpus, mechanism, always_active
        "channel",  # bind this connection to the caller's task, with control block fds
        "status",  # snapshot of every task
        "hold",  # manual suspend/resume of a task: target, hold
        "evict",  # manual memory eviction of a task: target
        "restore",  # bring an evicted task's memory back: target
        "detach",  # unregister a task (resumed first): target
        "ping",  # liveness check
    }
)

Message = dict[str, Any]


def encode(message: Message, limit: int = MAX_MESSAGE) -> bytes:
    """One message as a line of compact JSON; refuses non-finite numbers and messages over
    ``limit`` bytes."""
    try:
        data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    except ValueError as exc:
        raise ProtocolError(f"cannot send a message with a non-finite number: {exc}") from None
    if len(data) > limit:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the {limit}-byte limit")
    return data


def _refuse_constant(name: str) -> Any:
    raise ProtocolError(f"malformed message: {name} is not a number gpreempt accepts")


def decode(line: bytes) -> Message:
    """Parse one line into a message, or raise ProtocolError saying what was wrong."""
    try:
        value = json.loads(line, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # a 5,000-digit integer
        raise ProtocolError(f"malformed message (not JSON): {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError("malformed message: expected a JSON object")
    return value


def error_reply(exc: BaseException) -> Message:
    """The reply that carries an exception back to the client."""
    return {"ok": False, "error": str(exc), "kind": type(exc).__name__}


def raise_for_reply(reply: Message) -> Message:
    """Return a successful reply; re-raise a refusal as the error class the daemon named."""
    if reply.get("ok"):
        return reply
    kind = str(reply.get("kind", "GpreemptError"))
    message = str(reply.get("error", "request refused"))
    cls = BY_NAME.get(kind)
    if cls is None:
        raise RemoteError(message, kind)
    raise cls(message)


class Connection:
    """A framed, fd-passing view of a connected unix stream socket.

    Not thread-safe: give each thread its own connection, or guard one with a lock.
    ``max_message``: the largest message accepted from the other end (the daemon takes
    :data:`MAX_MESSAGE`, clients :data:`MAX_REPLY`).
    """

    def __init__(self, sock: socket.socket, max_message: int = MAX_REPLY) -> None:
        self.sock = sock
        self.max_message = max_message
        self._buffer = bytearray()
        self._fds: list[int] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        data = encode({**message, "nfds": len(fds)} if fds else message)
        if not fds:
            self.sock.sendall(data)
            return
        sent = self.sock.sendmsg(
            [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        )
        if sent < len(data):  # the fds went with the first part; the rest follows plainly
            self.sock.sendall(data[sent:])

    def feed(self) -> bool:
        """Read what is available into the buffer; False once the peer closed."""
        fds = array.array("i")
        data, ancdata, _flags, _addr = self.sock.recvmsg(
            65536, socket.CMSG_SPACE(MAX_FDS * fds.itemsize)
        )
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % fds.itemsize
                fds.frombytes(payload[:usable])
        self._fds.extend(fds)
        if len(self._fds) > MAX_PENDING_FDS:
            self._close_fds()
            raise ProtocolError(
                f"more than {MAX_PENDING_FDS} file descriptors arrived that no message claims"
            )
        if not data:
            return False
        self._buffer += data
        if len(self._buffer) > self.max_message and b"\n" not in self._buffer:
            raise ProtocolError(f"message exceeds the {self.max_message}-byte limit")
        return True

    @property
    def fds_held(self) -> int:
        """Descriptors received and not yet claimed by a message."""
        return len(self._fds)

    @property
    def buffered(self) -> bool:
        """Whether a complete message waits in the buffer."""
        return b"\n" in self._buffer

    def pop(self) -> tuple[Message, list[int]] | None:
        """The next complete message and the fds that came with it, if one is buffered.

        A message takes the number of fds it declares (``nfds``), oldest first. Fds that no
        message declares are closed once no buffered byte is left that they could belong to
        (a descriptor arrives with the first byte of its message)."""
        end = self._buffer.find(b"\n")
        if end < 0:
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        if len(line) > self.max_message:
            raise ProtocolError(f"message exceeds the {self.max_message}-byte limit")
        try:
            message = decode(line)
        except ProtocolError as exc:
            exc.framing_intact = True  # type: ignore[attr-defined] - the next line is whole
            if not self._buffer:
                self._close_fds()
            raise
        count = message.pop("nfds", 0)
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_FDS:
            self._close_fds()
            raise ProtocolError(f"malformed message: nfds must be 0 to {MAX_FDS}, got {count!r}")
        if count > len(self._fds):
            self._close_fds()
            raise ProtocolError(
                f"message declares {count} file descriptors but {len(self._fds)} arrived"
            )
        fds, self._fds = self._fds[:count], self._fds[count:]
        if not self._buffer:
            self._close_fds()  # strays: no message left to claim them
        return message, fds

    def _close_fds(self) -> None:
        for fd in self.pending_fds():
            _close_quietly(fd)

    def pending_fds(self) -> list[int]:
        """Fds received but not yet claimed by a message (closed by the owner on teardown)."""
        fds, self._fds = self._fds, []
        return fds

    def receive(self) -> tuple[Message, list[int]] | None:
        """Block until one message arrives; None if the peer closed first."""
        while True:
            item = self.pop()
            if item is not None:
                return item
            if not self.feed():
                if self._buffer:
                    raise ProtocolError("connection closed in the middle of a message")
                return None

    def request(self, message: Message, fds: Sequence[int] = ()) -> Message:
        """Send a request and wait for its reply (raising the daemon's refusal as an error).

        A daemon that does not answer within the socket's timeout, or whose connection
        breaks, raises DaemonUnavailable: never a bare socket error."""
        try:
            self.send(message, fds)
            item = self.receive()
        except TimeoutError:
            raise DaemonUnavailable(
                f"the daemon did not answer within {self.sock.gettimeout():g} s"
            ) from None
        except OSError as exc:
            raise DaemonUnavailable(
                f"the connection to the daemon broke: {exc.strerror or exc}"
            ) from None
        if item is None:
            raise ProtocolError("the daemon closed the connection before replying")
        reply, extra = item
        for fd in extra:
            _close_quietly(fd)
        return raise_for_reply(reply)

    def close(self) -> None:
        for fd in self.pending_fds():
            _close_quietly(fd)
        self.sock.close()


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
