"""Talking to the daemon: one connected socket, requests and replies as plain dicts.

A client never trusts a daemon another user could have put in its place: the default runtime
directory ``/tmp/gpreempt-<uid>`` lies where every user can create it first. So before
connecting, the directory must be a real directory owned by this user or root and closed to
other users' writes; once connected, the process that listens must run as this user or root
(``SO_PEERCRED``). Anything else is refused with one line that says what was found.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import SOCKET_NAME, resolve_runtime_dir
from ..errors import DaemonUnavailable, PermissionDenied
from ..messages import ChannelRequest, HoldRequest, RegisterRequest, TargetRequest, TaskFields
from ..names import MechanismName
from ..protocol import Connection, Message


class DaemonClient:
    """A connection to the node daemon of one runtime directory."""

    def __init__(self, connection: Connection, runtime_dir: Path) -> None:
        self.connection = connection
        self.runtime_dir = runtime_dir

    @classmethod
    def connect(
        cls, runtime_dir: str | os.PathLike[str] | None = None, timeout: float | None = 10.0
    ) -> DaemonClient:
        """Connect, or raise DaemonUnavailable saying where no daemon answered."""
        directory = resolve_runtime_dir(runtime_dir)
        path = directory / SOCKET_NAME
        check_trusted_dir(directory)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError, OSError) as exc:
            sock.close()
            raise DaemonUnavailable(
                f"no gpreempt daemon answers at {path} ({exc.strerror or exc}); "
                "start one with `gpreempt serve` (`gpreempt run` starts one for you)"
            ) from None
        try:
            check_trusted_daemon(sock, path)
        except PermissionDenied:
            sock.close()
            raise
        return cls(Connection(sock), directory)

    def request(self, op: str, fds: Sequence[int] = (), **fields: Any) -> Message:
        return self.connection.request({"op": op, **fields}, fds)

    def ping(self) -> Message:
        return self.request("ping")

    def send(
        self,
        request: RegisterRequest | ChannelRequest | HoldRequest | TargetRequest,
        fds: Sequence[int] = (),
    ) -> Message:
        """Send one typed request (gpreempt.messages) and return the daemon's reply."""
        return self.connection.request(request.to_wire(), fds)

    def register(
        self,
        pid: int,
        *,
        name: str | None = None,
        priority: int | str = 0,
        gpus: Sequence[int] = (0,),
        mechanism: str = MechanismName.AUTO,
        always_active: bool = False,
        owned: bool = False,
        **options: Any,
    ) -> Message:
        """Register ``pid`` as a task. ``owned``: the task ends when this connection closes.
        ``options``: the other fields of :class:`~gpreempt.messages.TaskFields`, which
        checks them all (a priority's name becomes its number there)."""
        task = TaskFields(
            name=name,
            priority=priority,
            gpus=tuple(gpus),
            mechanism=mechanism,
            always_active=always_active,
            **options,
        )
        return self.send(RegisterRequest(pid=pid, task=task, owned=owned))

    def open_channel(
        self,
        memfd: int,
        doorbell: int,
        register: TaskFields | Mapping[str, Any] | None = None,
        gpu: int | None = None,
    ) -> Message:
        """Hand the daemon this process's control block and doorbell, registering this process
        with ``register`` (task fields, or a mapping of them) if it is no task's yet; ``gpu``:
        the GPU this process uses, where it knows it (a rank of a multi-process job)."""
        if register is not None and not isinstance(register, TaskFields):
            register = TaskFields.from_wire(register) if register else None
        return self.send(ChannelRequest(register, gpu), fds=(memfd, doorbell))

    def status(self) -> Message:
        return self.request("status")

    def hold(self, target: str | int, hold: bool) -> Message:
        """Hold a task suspended (``hold``) or release it."""
        return self.send(HoldRequest(str(target), hold))

    def evict(self, target: str | int) -> Message:
        return self.send(TargetRequest("evict", str(target)))

    def restore(self, target: str | int) -> Message:
        return self.send(TargetRequest("restore", str(target)))

    def detach(self, target: str | int) -> Message:
        """Unregister a task (it is resumed and runs on unmanaged)."""
        return self.send(TargetRequest("detach", str(target)))

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _trusted_uid(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def check_trusted_dir(directory: Path) -> None:
    """Refuse a runtime directory another user could have created or can write: it must be
    a real directory (not a symlink) of this user or root, not writable by group or others.
    A directory that does not exist is left to the connection attempt to report."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DaemonUnavailable(f"cannot use {directory}: {exc.strerror or exc}") from None
    hint = "a daemon there could be anyone's; use another --runtime-dir"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PermissionDenied(f"{directory} is not a plain directory; {hint}")
    if not _trusted_uid(info.st_uid):
        raise PermissionDenied(
            f"{directory} belongs to uid {info.st_uid}, neither you nor root; {hint}"
        )
    if info.st_mode & 0o022:
        raise PermissionDenied(
            f"{directory} has mode {stat.S_IMODE(info.st_mode):o}, writable by other users; {hint}"
        )


def check_trusted_daemon(sock: socket.socket, path: Path) -> None:
    """Refuse a daemon that runs as neither this user nor root (the kernel's word)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if not _trusted_uid(uid):
        raise PermissionDenied(
            f"the process listening at {path} (pid {pid}) runs as uid {uid}, neither you nor "
            "root: not talking to it; use another --runtime-dir"
        )
