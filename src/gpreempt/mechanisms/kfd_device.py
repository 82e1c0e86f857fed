"""``/dev/kfd`` opened by the tracer, and the debugger calls on it (:class:`KfdDevice`).

Each method is one ``AMDKFD_IOC_DBG_TRAP`` op with the arguments the upstream kernel and
ROCdbgapi use; where the ABI is subtle the comment names the kernel function that decides.
:mod:`.kfd_session` strings these calls into a debug session of one task.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

from ..errors import MechanismFailed, MechanismUnavailable
from .kfd_abi import (
    AMDKFD_IOC_DBG_TRAP,
    AMDKFD_IOC_GET_VERSION,
    EC_PROCESS_RUNTIME,
    EC_QUEUE_NEW,
    GRACE_PERIOD,
    KFD_DEVICE,
    OP_DISABLE,
    OP_ENABLE,
    OP_GET_QUEUE_SNAPSHOT,
    OP_QUERY_DEBUG_EVENT,
    OP_RESUME_QUEUES,
    OP_SEND_RUNTIME_EVENT,
    OP_SUSPEND_QUEUES,
    REQUIRED_VERSION,
    DbgTrapArgs,
    GetVersionArgs,
    IoctlFn,
    QueueSnapshotEntry,
    RuntimeInfo,
    ec_mask,
    ioctl,
    u32,
)

#: The clear mask of every snapshot and suspension: a queue keeps EC_QUEUE_NEW from its
#: creation until a snapshot clears it, and suspend_single_queue refuses it meanwhile
#: (kfd_device_queue_manager.c). ROCdbgapi clears it on every snapshot for the same reason
#: (process.cpp, process_t::update_queues: "The new_queue bit gets cleared after each query").
CLEAR_NEW = ec_mask(EC_QUEUE_NEW)


class KfdDevice:
    """``/dev/kfd`` opened by this process, and the debugger calls on it.

    The descriptor serves only the process that opened it (kfd_chardev.c, kfd_ioctl: another
    process gets EBADF), so the tracer opens its own. ``ioctl`` and ``path`` exist for tests,
    which put a fake KFD behind them.
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
            raise explain(exc, pid, op) from None
        return args, result

    def enable(self, pid: int, dbg_fd: int) -> RuntimeInfo:
        """Start a debug session on ``pid``; returns its runtime's state.

        The kernel takes ``dbg_fd`` from this process's table (kfd_debug.c, kfd_dbg_trap_enable:
        fget, EBADF if absent) and answers EALREADY if a session exists. A ptrace parent may
        enable a process that has not opened /dev/kfd yet: the kernel creates its KFD process
        (kfd_ioctl_set_debug_trap, kfd_create_process(thread)).
        """
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
        """End the session: the kernel resumes every queue still suspended
        (kfd_dbg_trap_disable -> kfd_dbg_trap_deactivate -> resume_queues)."""
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
        """Let a runtime that enabled itself under the debugger go on.

        This only wakes the runtime blocked in AMDKFD_IOC_RUNTIME_ENABLE (kfd_debug.c,
        kfd_dbg_send_exception_to_runtime: up(&p->runtime_enable_sema)); it changes no state.
        """
        self._trap(
            pid,
            OP_SEND_RUNTIME_EVENT,
            "send_runtime_event",
            exception_mask=ec_mask(EC_PROCESS_RUNTIME),
        )

    def queues(self, pid: int) -> list[QueueSnapshotEntry]:
        """The target's queues now, clearing their EC_QUEUE_NEW bit (:data:`CLEAR_NEW`)."""
        size = ctypes.sizeof(QueueSnapshotEntry)
        capacity = 64
        while True:
            entries = (QueueSnapshotEntry * capacity)()
            args, _ = self._trap(
                pid,
                OP_GET_QUEUE_SNAPSHOT,
                "queue_snapshot",
                exception_mask=CLEAR_NEW,
                snapshot_buf_ptr=ctypes.addressof(entries),
                num_queues=capacity,
                entry_size=size,
            )
            count = args.queue_snapshot.num_queues
            if count <= capacity:
                return list(entries[:count])
            capacity = count

    def suspend(self, pid: int, queue_ids: list[int]) -> tuple[int, list[int]]:
        """Suspend these queues; returns how many were, and each id's status bits.

        An id comes back with QUEUE_INVALID_MASK for a queue that is gone, new (EC_QUEUE_NEW
        still set) or being destroyed, with QUEUE_ERROR_MASK for a hardware failure
        (kfd_device_queue_manager.c, suspend_queues).
        """
        ids = (u32 * len(queue_ids))(*queue_ids)
        _, result = self._trap(
            pid,
            OP_SUSPEND_QUEUES,
            "suspend_queues",
            exception_mask=CLEAR_NEW,
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


#: Why the kernel refuses, by errno (kfd_chardev.c kfd_ioctl and kfd_ioctl_set_debug_trap,
#: kfd_debug.c kfd_dbg_trap_enable).
REASONS = {
    errno.EPERM: "this thread is not its ptrace parent, or its ROCm runtime is not enabled for "
    "debugging (not started yet, or its activation failed: RUNTIME_ENABLED_BUSY/ERROR)",
    errno.ESRCH: "it has exited, or it has no KFD context (it exec'd and has not opened "
    "/dev/kfd since)",
    errno.EINVAL: "no debug session (the kernel ends one when the process execs), or the GPU "
    "scheduler does not support debugging (amdgpu sched_policy=2)",
    errno.EBADF: "the /dev/kfd descriptor belongs to another process, or the event "
    "descriptor is not open",
    errno.EACCES: "its ROCm runtime did not enable the debugger interface",
    errno.ENODEV: "a GPU it uses does not support debugging (pre-GFX9)",
    errno.EALREADY: "another debugger (rocgdb?) already debugs it",
    errno.EBUSY: "it uses GWS or CU masking, which exclude debugging on this GPU",
}


def explain(exc: OSError, pid: int, op: int) -> MechanismFailed:
    """The kernel's refusal of ``op`` on ``pid`` as one line; its errno stays attached."""
    reason = REASONS.get(exc.errno or 0, os.strerror(exc.errno or 0))
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
