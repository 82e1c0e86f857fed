"""The daemon's hold on its runtime directory: the lock file and the listening socket.

One daemon serves one directory: it takes the directory's lock (never through a symlink,
``runtime_dir.py`` checks the directory itself), writes its pid into it, and binds the socket
clients connect to. It records what the three paths name, so that it notices when they are
deleted or replaced under it (``intact``) and can take the directory again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from pathlib import Path

from ..config import LOCK_NAME, SOCKET_NAME, ensure_private_dir
from ..errors import DaemonAlreadyRunning, UsageError
from ..runtime_dir import FileIdentity


class RuntimeClaim:
    """The lock and socket of one runtime directory, and what their paths named when taken."""

    def __init__(self, runtime_dir: Path, shared: bool) -> None:
        self.runtime_dir = runtime_dir
        self.shared = shared
        self.lock_path = runtime_dir / LOCK_NAME
        self.socket_path = runtime_dir / SOCKET_NAME
        self.lock_fd: int | None = None
        self._dir_identity: FileIdentity | None = None
        self._lock_identity: FileIdentity | None = None
        self._socket_identity: FileIdentity | None = None

    def take_lock(self) -> None:
        """Check the runtime directory (runtime_dir.py) and take its lock file, never through
        a symlink; record what the directory and lock paths name. Taken again (the directory
        was recreated), the previous lock is released once the new one is held."""
        ensure_private_dir(self.runtime_dir, shared=self.shared)
        lock_path = self.lock_path
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
        self.release()
        self.lock_fd = fd

    def listen(self) -> socket.socket:
        """Bind the socket (replacing a stale one: we hold the lock) and listen."""
        path = self.socket_path
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

    def intact(self) -> bool:
        """Whether the directory, lock and socket paths still name what this daemon took."""
        return (
            FileIdentity.of(self.runtime_dir) == self._dir_identity
            and FileIdentity.of(self.lock_path) == self._lock_identity
            and FileIdentity.of(self.socket_path) == self._socket_identity
        )

    def holds_directory(self) -> bool:
        """Whether the directory and lock paths still name what this daemon took (the socket
        alone may have gone)."""
        return (
            self.lock_fd is not None
            and FileIdentity.of(self.runtime_dir) == self._dir_identity
            and FileIdentity.of(self.lock_path) == self._lock_identity
        )

    def release(self) -> None:
        """Let the lock go (its file stays: removing it would race a successor)."""
        if self.lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = None

    def remove_socket(self) -> None:
        """Remove the socket, only if its path still names ours (never another daemon's)."""
        if FileIdentity.of(self.socket_path) == self._socket_identity:
            with contextlib.suppress(OSError):
                self.socket_path.unlink()
