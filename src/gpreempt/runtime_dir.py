"""The runtime directory, taken safely: never through a symlink, never someone else's.

The socket in this directory is what keeps other users from suspending our processes, and
the default ``/tmp/gpreempt-<uid>`` lies in a directory every user can write. So a runtime
directory is used only if it is a real directory (not a symlink to one), owned by us, and
closed to other users' writes (0700; a ``--shared`` daemon's is 0755). One we create gets
that mode; one that exists with another is refused with a message, never chmodded: it may be
someone's home or project directory.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

ENV_RUNTIME_DIR = "GPREEMPT_RUNTIME_DIR"


def prepare_runtime_dir(path: Path, shared: bool = False) -> Path:
    """Create ``path`` (mode 0700, or 0755 for a shared daemon) or check the one there."""
    hint = f"choose another with --runtime-dir or ${ENV_RUNTIME_DIR}"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise UsageError(f"cannot use runtime directory {path}: {exc.strerror}; {hint}") from None
    if info is None:
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
            if shared:
                os.chmod(path, 0o755)  # ours: we just created it
        except FileExistsError:
            pass  # another process created it at the same time: check it below
        except OSError as exc:
            raise UsageError(
                f"cannot create runtime directory {path}: {exc.strerror}; {hint}"
            ) from None
        info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UsageError(
            f"runtime directory {path} is a symbolic link, which gpreempt never follows; {hint}"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"runtime directory {path} exists and is not a directory; {hint}")
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"runtime directory {path} belongs to uid {info.st_uid}, not to you; {hint}"
        )
    loose = info.st_mode & (0o022 if shared else 0o077)
    if loose:
        wanted = "755" if shared else "700"
        raise UsageError(
            f"runtime directory {path} has mode {stat.S_IMODE(info.st_mode):o}, open to other "
            f"users; gpreempt changes no directory it did not create: `chmod {wanted} {path}` "
            f"if it is only gpreempt's, or {hint}"
        )
    if shared and info.st_mode & 0o005 != 0o005:
        raise UsageError(
            f"runtime directory {path} has mode {stat.S_IMODE(info.st_mode):o}: other users "
            f"cannot reach a --shared daemon's socket in it; `chmod 755 {path}`, or {hint}"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"runtime directory {path} is not writable; {hint}")
    return path


def read_only(path: Path) -> bool:
    """Whether ``path`` lies on a read-only mount (a node daemon's directory mounted into a
    container: its socket can be connected to, nothing can be created in it)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@dataclass(frozen=True)
class FileIdentity:
    """Which file a path named when it was taken (device and inode)."""

    dev: int
    ino: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity | None:
        try:
            info = os.lstat(path)
        except OSError:
            return None
        return cls(info.st_dev, info.st_ino)
