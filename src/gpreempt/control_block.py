"""A client's control block: the mapped memfd and its doorbell, which the client creates and the
daemon adopts once checked. The words it holds, their offsets and the rules that read them are
:mod:`gpreempt.control`'s.

The block lives in a memfd the client creates and hands to the daemon over the socket, so no
file in a shared directory can be swapped or read by anyone else. The client seals its size
(``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``) before handing it over, and the daemon maps
nothing else (:meth:`ControlBlock.adopt`): a block that could shrink under the daemon's mapping
would crash it with SIGBUS at its next read. The daemon wakes a gate waiting on ``gate_closed``
(a futex) when it opens it, and may hand read-only descriptors of a block to the gates of the
same user's less important tasks, which then watch its activity words
(:class:`~gpreempt.control.ActivityView`, ``gpreempt.policy.watch``).

A memfd is born mode 0777, and whoever holds any descriptor of it, a read-only one included, can
reopen it read-write through ``/proc/self/fd``. So a block is made 0600, private to the uid that
created it (and root): by the client when it creates it, and again by the daemon, which refuses
a block it cannot restrict. A read-only view then stays read-only for every other user. (Seals
cannot do this: ``F_SEAL_FUTURE_WRITE`` would forbid every new writable mapping, the daemon's
own included, and ``F_SEAL_SEAL`` forbids adding it later anyway.)
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import struct

from . import futex
from .control import (
    DRIVER_STATES,
    MARKERS,
    OFF_ACTIVITY_EPOCH,
    OFF_AUTO_ACTIVE,
    OFF_BARRIER_LEAKS,
    OFF_BARRIERS_CHECKED,
    OFF_BARRIERS_ON,
    OFF_DEVICES,
    OFF_DRIVER_ASLEEP,
    OFF_DRIVER_BARRIERS,
    OFF_DRIVER_BOUND_WAITS,
    OFF_DRIVER_GATE,
    OFF_DRIVER_LAUNCHES,
    OFF_DRIVER_NS_PER_LAUNCH,
    OFF_DRIVER_WAITS,
    OFF_GATE_CLOSED,
    OFF_GATE_INSTALLED,
    OFF_GENERATION,
    OFF_HINTED,
    OFF_LAUNCHES,
    OFF_MARKER,
    OFF_QUIET,
    OFF_REQUESTS,
    OFF_SLEEP_OK,
    OFF_WAIT_NS,
    OFF_WAITS,
    OFF_WINDOW,
    OFF_WINDOW_SHARE_US,
    SIZE,
    ControlStats,
    closed_while_watched,
    driver_modes,
    wants_gpu,
)

#: Seals a control block must carry before the daemon maps it.
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
#: Mode of a control block's inode: only its owner (and root) may reopen it writable.
PRIVATE_MODE = 0o600

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class ControlBlock:
    """A mapped control block plus its doorbell."""

    def __init__(self, memfd: int, doorbell: int) -> None:
        self.memfd = memfd
        self.doorbell = doorbell
        self._map = mmap.mmap(memfd, SIZE)
        self._keep_mapped = False
        # the mapping never moves while open; the temporary view is released at once
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    @classmethod
    def create(cls) -> ControlBlock:
        """A fresh, zeroed block owned by this process, its size sealed."""
        memfd = os.memfd_create("gpreempt-control", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.fchmod(memfd, PRIVATE_MODE)
        os.ftruncate(memfd, SIZE)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
        doorbell = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        return cls(memfd, doorbell)

    @classmethod
    def adopt(cls, memfd: int, doorbell: int) -> ControlBlock:
        """A block a client handed over (daemon), once checked: ``memfd`` is a memfd of at
        least :data:`SIZE` bytes sealed against shrinking, growing and further seals, and
        ``doorbell`` an eventfd. The block is then made :data:`PRIVATE_MODE`, so that the
        read-only views the daemon hands out of it (:meth:`read_only_fd`) cannot be reopened
        writable by another user. Raises ValueError saying what is wrong (the caller still
        owns both descriptors then)."""
        what = _fd_kind(memfd)
        if not what.startswith("/memfd:"):
            raise ValueError(f"the control block must be a memfd, got {what or 'unknown'}")
        if not _plain_shmem(memfd):
            # a hugetlb memfd passes the name and seal checks, but a hole punched in it
            # (which seals do not forbid) would crash the daemon with SIGBUS
            raise ValueError("the control block must be a plain memfd (not MFD_HUGETLB)")
        try:
            seals = fcntl.fcntl(memfd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if seals & REQUIRED_SEALS != REQUIRED_SEALS:
            raise ValueError(
                "the control block's memfd must be sealed with F_SEAL_SHRINK, F_SEAL_GROW "
                "and F_SEAL_SEAL (ControlBlock.create does this)"
            )
        if seals & _WRITE_SEALS:
            raise ValueError("the control block's memfd is sealed against writing")
        size = os.fstat(memfd).st_size
        if size < SIZE:
            raise ValueError(f"the control block is {size} bytes, not {SIZE}")
        kind = _fd_kind(doorbell)
        if kind != "anon_inode:[eventfd]":
            raise ValueError(f"the doorbell must be an eventfd, got {kind or 'unknown'}")
        try:
            os.fchmod(memfd, PRIVATE_MODE)
        except OSError as exc:
            raise ValueError(
                f"cannot make the control block (of uid {os.fstat(memfd).st_uid}) private to "
                f"its owner: {exc.strerror}; a daemon not run as root takes only its own "
                "user's blocks"
            ) from None
        os.set_blocking(doorbell, False)
        try:
            return cls(memfd, doorbell)
        except OSError as exc:
            raise ValueError(f"cannot map the control block: {exc.strerror or exc}") from None

    @property
    def address(self) -> int:
        """Address of the mapping in this process, for native code that reads it directly."""
        return self._address

    def _get32(self, offset: int) -> int:
        return _U32.unpack_from(self._map, offset)[0]

    def _set32(self, offset: int, value: int) -> None:
        _U32.pack_into(self._map, offset, value)

    # daemon side
    def set_gate(self, closed: bool) -> None:
        """Close or open the gate (daemon); opening wakes the gate's waiting threads at once."""
        self._set32(OFF_GATE_CLOSED, 1 if closed else 0)
        self._set32(OFF_GENERATION, (self._get32(OFF_GENERATION) + 1) & 0xFFFFFFFF)
        if not closed:
            futex.wake(self._address + OFF_GATE_CLOSED)

    def release(self) -> None:
        """The daemon that wrote this block's words is gone (client): lift its in-flight share
        and let the gate sleep, then open the gate. Nothing can preempt the process until a
        daemon adopts the block again and says otherwise; a share left set would keep its gate
        tight and putting barriers, and a sleep left forbidden would keep it awake, for good."""
        self.set_quiet(False)  # and its raises ring at once, for the next daemon
        self.set_window_share(None)
        self.set_sleep_ok(True)
        self.set_gate(False)

    def close_while_watched(self, version: int) -> None:
        """Keep a closed gate closed only while the tasks of watch list ``version`` are active
        (daemon); :meth:`set_gate` closes it again for good. Wakes the gate's sleeping
        threads: they poll the watched tasks from now on."""
        self._set32(OFF_GATE_CLOSED, closed_while_watched(version))
        futex.wake(self._address + OFF_GATE_CLOSED)

    @property
    def gate_word(self) -> int:
        """``gate_closed`` as stored: 0 open, :data:`CLOSED`, or :func:`closed_while_watched`."""
        return self._get32(OFF_GATE_CLOSED)

    def set_window_share(self, ms: float | None) -> None:
        """Bound the gate's tight window to ``ms`` of GPU time; None lifts the bound (daemon)."""
        us = 0 if ms is None else max(1, min(0xFFFFFFFF, round(ms * 1000)))
        self._set32(OFF_WINDOW_SHARE_US, us)

    @property
    def window_share_ms(self) -> float | None:
        """The daemon's bound on the tight window, if any."""
        us = self._get32(OFF_WINDOW_SHARE_US)
        return us / 1000 if us else None

    def is_active(self) -> bool:
        """Whether the client says it wants the GPU (daemon), by :func:`wants_gpu`."""
        get = self._get32
        return wants_gpu(get(OFF_REQUESTS), get(OFF_AUTO_ACTIVE), get(OFF_HINTED))

    def set_sleep_ok(self, ok: bool) -> None:
        """Let the task's gate sleep (disable its operator hook) while nothing can preempt it."""
        self._set32(OFF_SLEEP_OK, 1 if ok else 0)

    def set_quiet(self, quiet: bool) -> None:
        """Say whether its raises may ring the doorbell a poll late (daemon; control.py)."""
        self._set32(OFF_QUIET, 1 if quiet else 0)

    @property
    def sleep_ok(self) -> bool:
        return self._get32(OFF_SLEEP_OK) != 0

    @property
    def hinted(self) -> bool:
        """The process has used ``request()`` (or a marker of whole requests): its requests
        alone say when it is active."""
        return self._get32(OFF_HINTED) != 0

    @property
    def barriers_on(self) -> bool:
        """The task's gate puts stream barriers: the GPU holds its queued work by itself."""
        return self._get32(OFF_BARRIERS_ON) != 0

    @property
    def marker(self) -> str:
        """What marks the process's requests without code (:data:`MARKERS`), '' if nothing."""
        return MARKERS.get(self._get32(OFF_MARKER), "")

    @property
    def gate_installed(self) -> bool:
        """Whether an in-process gate watches this block (daemon)."""
        return self._get32(OFF_GATE_INSTALLED) != 0

    def clear_activity(self) -> None:
        """Mark the client idle (daemon, once its connection is gone): gates that watch this
        block must not wait for a request that will never end."""
        self._set32(OFF_REQUESTS, 0)
        self._set32(OFF_AUTO_ACTIVE, 0)

    def read_only_fd(self) -> int:
        """A new read-only descriptor of the block, for a gate that watches it (daemon).

        Whoever receives it can map the block for reading only; reopening it writable
        through ``/proc`` takes the block's owner or root (:data:`PRIVATE_MODE`). The caller
        closes it.
        """
        return os.open(f"/proc/self/fd/{self.memfd}", os.O_RDONLY | os.O_CLOEXEC)

    def drain_doorbell(self) -> bool:
        """Reset the doorbell after it rang (daemon); False if it does not reset (an eventfd
        in semaphore mode keeps ringing: its client is dropped)."""
        for _ in range(8):
            try:
                os.eventfd_read(self.doorbell)
            except BlockingIOError:
                return True
        return False

    def stats(self) -> ControlStats:
        return ControlStats(
            requests=self._get32(OFF_REQUESTS),
            auto_active=self._get32(OFF_AUTO_ACTIVE) != 0,
            launches=_U64.unpack_from(self._map, OFF_LAUNCHES)[0],
            waits=_U64.unpack_from(self._map, OFF_WAITS)[0],
            wait_seconds=_U64.unpack_from(self._map, OFF_WAIT_NS)[0] / 1e9,
            window=self._get32(OFF_WINDOW),
            gate_installed=self._get32(OFF_GATE_INSTALLED) != 0,
            driver_gate=self.driver_gate,
            driver_launches=self.driver_launches,
            driver_waits=_U64.unpack_from(self._map, OFF_DRIVER_WAITS)[0],
            driver_barriers=_U64.unpack_from(self._map, OFF_DRIVER_BARRIERS)[0],
            **driver_modes(self._get32(OFF_DRIVER_ASLEEP)),
            driver_us_per_launch=self._get32(OFF_DRIVER_NS_PER_LAUNCH) / 1e3,
            driver_bound_waits=self._get32(OFF_DRIVER_BOUND_WAITS),
            driver_barriers_checked=self._get32(OFF_BARRIERS_CHECKED),
        )

    @property
    def driver_gate(self) -> str:
        """The state of the process's driver-level gate (:data:`DRIVER_STATES`)."""
        value = self._get32(OFF_DRIVER_GATE)
        return DRIVER_STATES[value] if value < len(DRIVER_STATES) else "failed"

    @property
    def driver_launches(self) -> int:
        """Launches the driver-level gate saw (while it holds them: one more per thread)."""
        return _U64.unpack_from(self._map, OFF_DRIVER_LAUNCHES)[0]

    @property
    def devices(self) -> frozenset[int]:
        """The GPUs (physical indexes) its process made a CUDA context on, unasked for."""
        bits = _U64.unpack_from(self._map, OFF_DEVICES)[0]
        return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)

    # client side
    @property
    def gate_closed(self) -> bool:
        return self._get32(OFF_GATE_CLOSED) != 0

    def set_requests(self, count: int, hint: bool = True) -> None:
        """Publish the number of open request scopes and ring the doorbell (client). A scope
        that ``hint``s (``request()``, a marker of whole requests) says that from now on the
        process's requests alone tell when it is active; one that does not (a marker of a
        part of each request: ``generate``) adds to what its launches tell."""
        if count and hint:
            self._set32(OFF_HINTED, 1)
        self._set_activity_word(OFF_REQUESTS, count)
        self.ring()

    def set_auto_active(self, active: bool) -> None:
        """Publish auto-detected activity and ring the doorbell (client)."""
        self._set_activity_word(OFF_AUTO_ACTIVE, 1 if active else 0)
        self.ring()

    def _set_activity_word(self, offset: int, value: int) -> None:
        """Write a word of the activity pair; a rise from 0 bumps the activity epoch first
        (``control.py``: how gates tell a task that stayed active from one that dropped and
        rose again between two looks). The C++ gates do the same (``gate_words.h``)."""
        if value and not self._get32(offset):
            self._set32(OFF_ACTIVITY_EPOCH, (self._get32(OFF_ACTIVITY_EPOCH) + 1) & 0xFFFFFFFF)
        self._set32(offset, value)

    @property
    def activity_epoch(self) -> int:
        """How many times the requests or auto_active word rose from 0."""
        return self._get32(OFF_ACTIVITY_EPOCH)

    @property
    def barrier_leaks(self) -> int:
        """Times the driver-level gate saw its GPU work pass a barrier a watched task held."""
        return self._get32(OFF_BARRIER_LEAKS)

    def set_barriers_on(self, on: bool) -> None:
        """Say that stream barriers, with no launch gate, hold this process's queued work
        (client, :mod:`gpreempt.client.stream_barriers`): ``gate_installed`` and
        ``barriers_on`` together, so the daemon closes the gate word instead of locking."""
        self._set32(OFF_BARRIERS_ON, 1 if on else 0)
        self._set32(OFF_GATE_INSTALLED, 1 if on else 0)
        self.ring()

    def set_marker(self, name: str) -> None:
        """Say what marks this process's requests without code (client): a name of
        :data:`MARKERS`, or '' for nothing."""
        code = next((c for c, n in MARKERS.items() if n == name), 0)
        if name and not code:
            raise ValueError(f"unknown marker {name!r}: one of {', '.join(MARKERS.values())}")
        self._set32(OFF_MARKER, code)

    def ring(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.eventfd_write(self.doorbell, 1)

    def keep_mapped(self) -> None:
        """Never unmap this block, not even on :meth:`close`: the GPU reads its words (stream
        barriers), and the driver's registration of its page would be taken for any later
        mapping at the same address."""
        self._keep_mapped = True

    def close(self) -> None:
        if self._keep_mapped:
            _KEPT_MAPPED.append(self._map)
        else:
            try:
                self._map.close()
            except (BufferError, ValueError):
                pass  # native code still holds a view; the mapping dies with the process
        for fd in (self.memfd, self.doorbell):
            with contextlib.suppress(OSError):
                os.close(fd)


#: Seals that forbid the daemon's writable mapping (F_SEAL_FUTURE_WRITE is 0x10).
_WRITE_SEALS = fcntl.F_SEAL_WRITE | getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)
#: ``f_type`` of the filesystem plain memfds live on (shmem; hugetlb ones: HUGETLBFS_MAGIC).
_TMPFS_MAGIC = 0x01021994


def _plain_shmem(fd: int) -> bool:
    """Whether ``fd`` lives on shmem with ordinary pages (not hugetlbfs): by ``fstatfs``'s
    ``f_type``, else (no fstatfs) by its block size being the page size."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first word
    if _libc.fstatfs(fd, buf) == 0:
        return ctypes.c_long.from_buffer(buf).value == _TMPFS_MAGIC
    return os.fstat(fd).st_blksize == mmap.PAGESIZE


def _fd_kind(fd: int) -> str:
    """What ``fd`` is, as /proc names it (``/memfd:NAME (deleted)``, ``anon_inode:[eventfd]``,
    ``pipe:[N]``...), or '' if it cannot be told."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


#: Blocks whose pages the GPU may read, mapped until the process exits.
_KEPT_MAPPED: list[mmap.mmap] = []

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
