"""Freeing work held at stream barriers when nobody else is left to.

A gate with stream barriers (``docs/gate.md``) leaves waits on the GPU for the activity words
of the tasks it watches. When such a task's process ends inside a request, the daemon clears
its words (``ControlBlock.clear_activity``) and the held work goes on. When the daemon is gone
too, nobody would: so the session, once its daemon went away, keeps an eye on the tasks it
watched, and if one of them exits with its words still raised, it clears them itself, through
a writable descriptor reopened from the read-only one the daemon sent (the blocks are of its
own user's tasks; ``/proc/self/fd`` reopens them as the owner's memory permits).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
from dataclasses import dataclass

from ..control import OFF_AUTO_ACTIVE, OFF_REQUESTS, SIZE, ActivityView


@dataclass
class WatchedBlock:
    """A watched task's block, as the session holds it: the view the gate reads, the
    descriptor it came in (kept to reopen it writable), and its owner process."""

    view: ActivityView
    fd: int
    pidfd: int | None  # None: the daemon did not say whose it is, or the owner had gone

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


def open_owner(pid: object) -> int | None:
    """A pidfd for the watched block's owner, or None if there is no usable pid."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
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
                    with contextlib.suppress(OSError):
                        block.clear_activity()
    finally:
        for block in blocks:
            block.close()
