"""Freeing work held at stream barriers when nobody else is left to.

A gate with stream barriers (``docs/gate.md``) leaves waits on the GPU for the activity words
of the tasks it watches. When such a task's process ends inside a request, the daemon clears
its words (``ControlBlock.clear_activity``) and the held work goes on. When the daemon is gone
too, nobody would: so the session, once its daemon went away, keeps an eye on the tasks it
watched, and if one of them exits with its words still raised, it clears them itself, through
a writable descriptor reopened from the read-only one the daemon sent.

That reopening works only for a block of the session's own uid (or as root): blocks are 0600
(``gpreempt.control_block.PRIVATE_MODE``). Another user's block can reach a session inside one of
its user's tasks (a root process of a job that ran ``sudo``), and nobody left could clear it:
so the session does not watch such a block at all (:meth:`WatchedBlock.map`): for that
task its gate waits for the daemon to open it, and the session opens it itself when the
daemon goes away.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
import sys
from dataclasses import dataclass
from typing import TypeGuard

from ..control import OFF_AUTO_ACTIVE, OFF_REQUESTS, SIZE, ActivityView


@dataclass
class WatchedBlock:
    """A watched task's block, as the session holds it: the view the gate reads, the
    descriptor it came in (kept to reopen it writable), and its owner process."""

    view: ActivityView
    fd: int
    pidfd: int | None  # None: the daemon did not say whose it is, or the owner had gone
    pid: int | None = None  # the owner, as the daemon named it
    key: tuple[int, int] = (0, 0)  # the block's file (device, inode): one block, one key

    @classmethod
    def map(
        cls,
        fd: int,
        pid: object,
        view: ActivityView | None = None,
        key: tuple[int, int] | None = None,
    ) -> WatchedBlock:
        """Watch the block behind ``fd``, a read-only descriptor the daemon sent, of a task
        whose process is ``pid``; ``view``: this block's mapping, already made for an earlier
        list (:func:`block_key` says it is the same block), read where it is instead of
        mapped again; ``key``: its :func:`block_key`, where the caller has it. Raises
        OSError, leaving ``fd`` to the caller, if the block cannot be mapped, or if this
        process could not clear its words should the owner exit while the daemon is gone
        (PermissionError: another user's block): barriers must never wait on words that
        nobody left could clear."""
        key = key if key is not None else block_key(fd)
        os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC))
        view = view if view is not None else ActivityView(fd)
        return cls(view, fd, open_owner(pid), pid if _usable_pid(pid) else None, key)

    def named(self, pid: object) -> WatchedBlock:
        """This block, its owner now known if it was not (a later list named it)."""
        if self.pidfd is None and _usable_pid(pid):
            self.pidfd, self.pid = open_owner(pid), pid
        return self

    def clear_activity(self) -> None:
        """Mark the watched task idle in its own block (it has exited)."""
        writable = os.open(f"/proc/self/fd/{self.fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            with mmap.mmap(writable, SIZE) as words:
                struct.pack_into("<I", words, OFF_REQUESTS, 0)
                struct.pack_into("<I", words, OFF_AUTO_ACTIVE, 0)
        finally:
            os.close(writable)

    def close(self) -> None:
        """Close the descriptors (the view stays mapped: the gate or the GPU may read it)."""
        for fd in (self.fd, self.pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def block_key(fd: int) -> tuple[int, int]:
    """Which block ``fd`` is: its file's device and inode. Two descriptors of one block have
    one key, and no other block can take it while a mapping of this one lives (the mapping
    keeps the file)."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _usable_pid(pid: object) -> TypeGuard[int]:
    """A pid, as a watch push may name one: a positive int, not a bool."""
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0


def open_owner(pid: object) -> int | None:
    """A pidfd for the watched block's owner, or None if there is no usable pid."""
    if not _usable_pid(pid):
        return None
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None  # gone already, or no pidfds here: it cannot be watched


def free_stranded(blocks: list[WatchedBlock]) -> None:
    """Wait for the owner of each block to exit, then clear its words if they are still
    raised; close them all at the end. Runs on its own thread after the daemon went away.
    (An idle moment of a live owner proves nothing: a barrier further down the queue may
    reach its words during its next request.)"""
    poller = select.poll()
    pending = {block.pidfd: block for block in blocks if block.pidfd is not None}
    for pidfd in pending:
        poller.register(pidfd, select.POLLIN)
    try:
        while pending:
            for pidfd, _events in poller.poll():  # a pidfd is readable once its process exited
                block = pending.pop(pidfd, None)
                poller.unregister(pidfd)
                if block is not None and block.view.is_active():
                    try:
                        block.clear_activity()
                    except OSError as exc:
                        print(
                            f"gpreempt: cannot mark watched process {block.pid}, which exited "
                            f"inside a request, idle ({exc.strerror}): work queued behind this "
                            "process's stream barriers stays held",
                            file=sys.stderr,
                        )
    finally:
        for block in blocks:
            block.close()
