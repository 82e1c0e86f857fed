"""The tracer's side of mechanism ``kfd``: the ``/dev/kfd`` debugger calls that unmap and map
again a traced process's GPU queues (:class:`KfdDevice`), and one debugging session of one
task (:class:`KfdSession`), run by ``gpreempt run``'s tracer thread (:mod:`gpreempt.tracer`).
The kernel rules these calls follow are listed in :mod:`gpreempt.mechanisms.kfd`."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Callable

from ..errors import MechanismFailed, MechanismUnavailable
from .kfd_abi import (
    AMDKFD_IOC_DBG_TRAP,
    AMDKFD_IOC_GET_VERSION,
    EC_PROCESS_RUNTIME,
    GRACE_PERIOD,
    KFD_DEVICE,
    OP_DISABLE,
    OP_ENABLE,
    OP_GET_QUEUE_SNAPSHOT,
    OP_QUERY_DEBUG_EVENT,
    OP_RESUME_QUEUES,
    OP_SEND_RUNTIME_EVENT,
    OP_SUSPEND_QUEUES,
    QUEUE_ERROR_MASK,
    QUEUE_INVALID_MASK,
    REQUIRED_VERSION,
    RUNTIME_ENABLED_BUSY,
    DbgTrapArgs,
    GetVersionArgs,
    IoctlFn,
    QueueSnapshotEntry,
    RuntimeInfo,
    ec_mask,
    ioctl,
    u32,
)


class KfdDevice:
    """``/dev/kfd`` opened by this process, and the debugger calls on it.

    ``ioctl`` and ``path`` exist for tests, which put a fake KFD behind them.
    """

    def __init__(self, path: str = KFD_DEVICE, ioctl: IoctlFn = ioctl) -> None:
        self.ioctl = ioctl
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MechanismUnavailable(
                f"{path} does not exist: no AMD GPU driver (amdgpu with KFD) on this machine"
            ) from None
        except PermissionError:
            raise MechanismUnavailable(
                f"no permission to open {path}: add the user to the group that owns it "
                "(usually 'render' or 'video')"
            ) from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def version(self) -> tuple[int, int]:
        args = GetVersionArgs()
        self.ioctl(self.fd, AMDKFD_IOC_GET_VERSION, args)
        return args.major_version, args.minor_version

    def check_version(self) -> None:
        major, minor = self.version()
        if (major, minor) < REQUIRED_VERSION or major != REQUIRED_VERSION[0]:
            need = ".".join(map(str, REQUIRED_VERSION))
            raise MechanismUnavailable(
                f"the KFD driver speaks ioctl version {major}.{minor}; mechanism 'kfd' needs "
                f"{need} or newer (its debugger API: mainline Linux 6.4+, or a recent "
                "amdgpu-dkms). Use --mechanism signal or gate."
            )

    def _trap(self, pid: int, op: int, name: str, **fields: object) -> tuple[DbgTrapArgs, int]:
        """One AMDKFD_IOC_DBG_TRAP call: the arguments as the kernel left them, and its result."""
        args = DbgTrapArgs(pid=pid, op=op)
        member = getattr(args, name) if name else None
        for key, value in fields.items():
            setattr(member, key, value)
        try:
            result = self.ioctl(self.fd, AMDKFD_IOC_DBG_TRAP, args)
        except OSError as exc:
            raise _explain(exc, pid, op) from None
        return args, result

    def enable(self, pid: int, dbg_fd: int) -> RuntimeInfo:
        """Start a debug session on ``pid``; returns its runtime's state."""
        info = RuntimeInfo()
        self._trap(
            pid,
            OP_ENABLE,
            "enable",
            exception_mask=ec_mask(EC_PROCESS_RUNTIME),
            rinfo_ptr=ctypes.addressof(info),
            rinfo_size=ctypes.sizeof(info),
            dbg_fd=dbg_fd,
        )
        return info

    def disable(self, pid: int) -> None:
        """End the session: the kernel resumes every queue still suspended."""
        self._trap(pid, OP_DISABLE, "")

    def runtime_event_pending(self, pid: int) -> bool:
        """Whether the target's runtime waits for the debugger's go (and clear the event)."""
        mask = ec_mask(EC_PROCESS_RUNTIME)
        try:
            args, _ = self._trap(
                pid, OP_QUERY_DEBUG_EVENT, "query_debug_event", exception_mask=mask
            )
        except MechanismFailed as exc:
            if getattr(exc, "errno", None) == errno.EAGAIN:
                return False
            raise
        return bool(args.query_debug_event.exception_mask & mask)

    def release_runtime(self, pid: int) -> None:
        """Let a runtime that enabled itself under the debugger go on."""
        self._trap(
            pid,
            OP_SEND_RUNTIME_EVENT,
            "send_runtime_event",
            exception_mask=ec_mask(EC_PROCESS_RUNTIME),
        )

    def queues(self, pid: int) -> list[QueueSnapshotEntry]:
        """The target's queues now."""
        size = ctypes.sizeof(QueueSnapshotEntry)
        capacity = 64
        while True:
            entries = (QueueSnapshotEntry * capacity)()
            args, _ = self._trap(
                pid,
                OP_GET_QUEUE_SNAPSHOT,
                "queue_snapshot",
                snapshot_buf_ptr=ctypes.addressof(entries),
                num_queues=capacity,
                entry_size=size,
            )
            count = args.queue_snapshot.num_queues
            if count <= capacity:
                return list(entries[:count])
            capacity = count

    def suspend(self, pid: int, queue_ids: list[int]) -> tuple[int, list[int]]:
        """Suspend these queues; returns how many were, and each id's status bits."""
        ids = (u32 * len(queue_ids))(*queue_ids)
        _, result = self._trap(
            pid,
            OP_SUSPEND_QUEUES,
            "suspend_queues",
            queue_array_ptr=ctypes.addressof(ids),
            num_queues=len(queue_ids),
            grace_period=GRACE_PERIOD,
        )
        return result, list(ids)

    def resume(self, pid: int, queue_ids: list[int]) -> tuple[int, list[int]]:
        """Resume these queues; returns how many were, and each id's status bits."""
        ids = (u32 * len(queue_ids))(*queue_ids)
        _, result = self._trap(
            pid,
            OP_RESUME_QUEUES,
            "resume_queues",
            queue_array_ptr=ctypes.addressof(ids),
            num_queues=len(queue_ids),
        )
        return result, list(ids)


def _explain(exc: OSError, pid: int, op: int) -> MechanismFailed:
    reasons = {
        errno.EPERM: "this thread is not its ptrace parent, or its ROCm runtime has not "
        "started yet",
        errno.ESRCH: "it has exited, or it has no KFD context",
        errno.EINVAL: "no debug session, or the GPU scheduler does not support debugging "
        "(amdgpu sched_policy=2)",
        errno.EACCES: "its ROCm runtime did not enable the debugger interface",
        errno.ENODEV: "a GPU it uses does not support debugging (pre-GFX9)",
        errno.EALREADY: "another debugger (rocgdb?) already debugs it",
        errno.EBUSY: "it uses GWS or CU masking, which exclude debugging on this GPU",
    }
    reason = reasons.get(exc.errno or 0, os.strerror(exc.errno or 0))
    failure = MechanismFailed(f"KFD debugger op {op} on process {pid} failed: {reason}")
    failure.errno = exc.errno  # type: ignore[attr-defined]
    return failure


def check_available(path: str = KFD_DEVICE) -> None:
    """Raise MechanismUnavailable, saying why, unless ``/dev/kfd`` offers the debugger API."""
    device = KfdDevice(path)
    try:
        device.check_version()
    except OSError as exc:
        raise MechanismUnavailable(
            f"{path} does not answer AMDKFD_IOC_GET_VERSION: {exc}"
        ) from None
    finally:
        device.close()


class KfdSession:
    """The debug session on one traced process, driven from its tracer thread only.

    The session starts at the first suspension (the process has a KFD context by then if it
    uses the GPU) and ends with :meth:`close`, which resumes everything.
    """

    def __init__(self, pid: int, device_factory: Callable[[], KfdDevice] = KfdDevice) -> None:
        self.pid = pid
        self._factory = device_factory
        self._device: KfdDevice | None = None
        self._events_r = self._events_w = -1
        self.suspended: list[int] = []

    @property
    def events_fd(self) -> int:
        """Readable when the kernel raises an exception the session asked for (-1: none)."""
        return self._events_r

    def _start(self) -> KfdDevice:
        if self._device is not None:
            return self._device
        device = self._factory()
        try:
            device.check_version()
            # the kernel writes one byte per event: a pipe, as ROCdbgapi uses
            self._events_r, self._events_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            info = device.enable(self.pid, self._events_w)
        except BaseException:
            device.close()
            self._close_pipe()
            raise
        self._device = device
        if info.runtime_state == RUNTIME_ENABLED_BUSY:
            device.release_runtime(self.pid)
        return device

    def answer_events(self) -> None:
        """Release the target's runtime if it waits for the debugger (see the module doc)."""
        with contextlib.suppress(OSError):
            while os.read(self._events_r, 64):
                pass
        if self._device is not None and self._device.runtime_event_pending(self.pid):
            self._device.release_runtime(self.pid)

    def suspend(self) -> int:
        """Suspend every queue of the process; returns how many are suspended."""
        device = self._start()
        self.answer_events()
        fresh = [q.queue_id for q in device.queues(self.pid) if q.queue_id not in self.suspended]
        if fresh:
            _, statuses = device.suspend(self.pid, fresh)
            for queue_id, status in zip(fresh, statuses, strict=True):
                if status & QUEUE_ERROR_MASK:
                    self.resume()
                    raise MechanismFailed(
                        f"the GPU failed to suspend queue {queue_id} of process {self.pid}"
                    )
                if not status & QUEUE_INVALID_MASK:  # new or being destroyed: not held
                    self.suspended.append(queue_id)
        return len(self.suspended)

    def resume(self) -> int:
        """Resume the queues :meth:`suspend` suspended; returns how many it resumed."""
        if self._device is None or not self.suspended:
            self.suspended = []
            return 0
        ids, self.suspended = self.suspended, []
        count, _ = self._device.resume(self.pid, ids)
        return count

    def close(self) -> None:
        """Resume everything and end the session (also when the process is gone)."""
        device, self._device = self._device, None
        if device is not None:
            with contextlib.suppress(MechanismFailed):
                if self.suspended:
                    device.resume(self.pid, self.suspended)
            self.suspended = []
            with contextlib.suppress(MechanismFailed):
                device.disable(self.pid)
            device.close()
        self._close_pipe()

    def _close_pipe(self) -> None:
        for fd in (self._events_r, self._events_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._events_r = self._events_w = -1
