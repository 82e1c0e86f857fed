"""Talking to the daemon: one connected socket, requests and replies as plain dicts."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import SOCKET_NAME, resolve_runtime_dir
from ..errors import DaemonUnavailable
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
        return cls(Connection(sock), directory)

    def request(self, op: str, fds: Sequence[int] = (), **fields: Any) -> Message:
        return self.connection.request({"op": op, **fields}, fds)

    def ping(self) -> Message:
        return self.request("ping")

    def register(
        self,
        pid: int,
        *,
        name: str | None = None,
        priority: int = 0,
        gpus: Sequence[int] = (0,),
        mechanism: str = "auto",
        always_active: bool = False,
        owned: bool = False,
        **options: Any,
    ) -> Message:
        """Register ``pid`` as a task. ``owned``: the task ends when this connection closes."""
        return self.request(
            "register",
            pid=pid,
            name=name,
            priority=priority,
            gpus=list(gpus),
            mechanism=mechanism,
            always_active=always_active,
            owned=owned,
            **options,
        )

    def open_channel(self, memfd: int, doorbell: int, **fields: Any) -> Message:
        """Hand the daemon this process's control block and doorbell."""
        return self.request("channel", fds=(memfd, doorbell), **fields)

    def status(self) -> Message:
        return self.request("status")

    def hold(self, target: str | int, hold: bool) -> Message:
        """Suspend (hold=True) or release a task by name or pid, whatever the policy says."""
        return self.request("hold", target=str(target), hold=hold)

    def evict(self, target: str | int) -> Message:
        return self.request("evict", target=str(target))

    def restore(self, target: str | int) -> Message:
        return self.request("restore", target=str(target))

    def detach(self, target: str | int) -> Message:
        """Unregister a task (by pid or name): the daemon resumes it and forgets it."""
        return self.request("detach", target=str(target))

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
