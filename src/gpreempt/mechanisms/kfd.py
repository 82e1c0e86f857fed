"""The ``kfd`` mechanism: suspend an AMD GPU task's queues through the KFD debugger interface.

``AMDKFD_IOC_DBG_TRAP`` (KFD ioctl 1.13, the debugger API) lets the *ptrace parent* of a
process unmap its user-mode queues (``SUSPEND_QUEUES``) and map them again
(``RESUME_QUEUES``). The hardware saves the waves that were running (CWSR, compute wave
save/restore) and restores them on resume, so unlike a launch gate or the NVIDIA driver lock
this stops work already queued on the GPU, not only the next submission. The kernel allows it
to the tracer thread alone, so ``gpreempt run --mechanism kfd`` traces its command with
``PTRACE_SEIZE`` (see :mod:`gpreempt.tracer`) and performs the calls on that thread when the
daemon asks through a socket private to the launcher.

The ABI below is copied from the upstream kernel's ``include/uapi/linux/kfd_ioctl.h`` and
follows ``drivers/gpu/drm/amd/amdkfd/kfd_chardev.c`` (``kfd_ioctl_set_debug_trap``) and
``kfd_debug.c``. Nothing here has run on AMD hardware yet; ``gpreempt selftest`` checks it on
the user's machine.

Kernel rules this code follows:

* ``/dev/kfd`` is usable only by the process that opened it; the tracer opens its own.
* Every op but ``DISABLE`` needs the caller to be ``ptrace_parent`` of the target's main thread
  (EPERM otherwise), and every op but ``ENABLE`` needs ``ENABLE`` first (EINVAL otherwise).
* ``SUSPEND_QUEUES``/``RESUME_QUEUES`` need the target's ROCm runtime to have enabled itself
  (``AMDKFD_IOC_RUNTIME_ENABLE``, at ``hsa_init``; EPERM before). A runtime that enables
  itself while a debugger is attached waits until the debugger answers with
  ``SEND_RUNTIME_EVENT(EC_PROCESS_RUNTIME)``; :class:`KfdSession` answers at once.
* ``DISABLE`` resumes every queue still suspended, and the kernel disables every session of a
  debugger process that exits, however it exits: a queue is never left suspended by a
  launcher that dies.
* Queues created after a suspension are not suspended; the mechanism also stops the task's
  CPU side (SIGSTOP of its process group) so that it creates none meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import struct
from collections.abc import Callable
from pathlib import Path

from ..errors import MechanismFailed, MechanismUnavailable, NoSuchProcess
from ..procinfo import read_process
from .base import Mechanism, Target
from .signal import send

KFD_DEVICE = "/dev/kfd"
#: The KFD ioctl interface version that introduced the debugger API (kfd_ioctl.h: "1.13 - Add
#: debugger API"); older kernels are refused.
REQUIRED_VERSION = (1, 13)

u32 = ctypes.c_uint32
u64 = ctypes.c_uint64


class GetVersionArgs(ctypes.Structure):
    _fields_ = [("major_version", u32), ("minor_version", u32)]


class RuntimeInfo(ctypes.Structure):
    """struct kfd_runtime_info."""

    _fields_ = [("r_debug", u64), ("runtime_state", u32), ("ttmp_setup", u32)]


class EnableArgs(ctypes.Structure):
    _fields_ = [("exception_mask", u64), ("rinfo_ptr", u64), ("rinfo_size", u32), ("dbg_fd", u32)]


class SendRuntimeEventArgs(ctypes.Structure):
    _fields_ = [("exception_mask", u64), ("gpu_id", u32), ("queue_id", u32)]


class SuspendQueuesArgs(ctypes.Structure):
    _fields_ = [
        ("exception_mask", u64),
        ("queue_array_ptr", u64),
        ("num_queues", u32),
        ("grace_period", u32),
    ]


class ResumeQueuesArgs(ctypes.Structure):
    _fields_ = [("queue_array_ptr", u64), ("num_queues", u32), ("pad", u32)]


class QueryDebugEventArgs(ctypes.Structure):
    _fields_ = [("exception_mask", u64), ("gpu_id", u32), ("queue_id", u32)]


class QueueSnapshotArgs(ctypes.Structure):
    _fields_ = [
        ("exception_mask", u64),
        ("snapshot_buf_ptr", u64),
        ("num_queues", u32),
        ("entry_size", u32),
    ]


class DeviceSnapshotArgs(ctypes.Structure):
    _fields_ = [
        ("exception_mask", u64),
        ("snapshot_buf_ptr", u64),
        ("num_devices", u32),
        ("entry_size", u32),
    ]


class _DbgTrapOp(ctypes.Union):
    # the members gpreempt uses, and the largest of the others, so the union has the kernel's size
    _fields_ = [
        ("enable", EnableArgs),
        ("send_runtime_event", SendRuntimeEventArgs),
        ("suspend_queues", SuspendQueuesArgs),
        ("resume_queues", ResumeQueuesArgs),
        ("query_debug_event", QueryDebugEventArgs),
        ("queue_snapshot", QueueSnapshotArgs),
        ("device_snapshot", DeviceSnapshotArgs),
    ]


class DbgTrapArgs(ctypes.Structure):
    """struct kfd_ioctl_dbg_trap_args: the target pid, the op, and the op's arguments."""

    _anonymous_ = ("u",)
    _fields_ = [("pid", u32), ("op", u32), ("u", _DbgTrapOp)]


class QueueSnapshotEntry(ctypes.Structure):
    """struct kfd_queue_snapshot_entry."""

    _fields_ = [
        ("exception_status", u64),
        ("ring_base_address", u64),
        ("write_pointer_address", u64),
        ("read_pointer_address", u64),
        ("ctx_save_restore_address", u64),
        ("queue_id", u32),
        ("gpu_id", u32),
        ("ring_size", u32),
        ("queue_type", u32),
        ("ctx_save_restore_area_size", u32),
        ("reserved", u32),
    ]


def _ioc(direction: int, nr: int, size: int) -> int:
    """Linux _IOC(dir, 'K', nr, size) (asm-generic/ioctl.h)."""
    return (direction << 30) | (size << 16) | (ord("K") << 8) | nr


_IOC_READ, _IOC_WRITE = 2, 1
#: AMDKFD_IOR(0x01, struct kfd_ioctl_get_version_args)
AMDKFD_IOC_GET_VERSION = _ioc(_IOC_READ, 0x01, ctypes.sizeof(GetVersionArgs))
#: AMDKFD_IOWR(0x26, struct kfd_ioctl_dbg_trap_args)
AMDKFD_IOC_DBG_TRAP = _ioc(_IOC_READ | _IOC_WRITE, 0x26, ctypes.sizeof(DbgTrapArgs))

# enum kfd_dbg_trap_operations
OP_ENABLE = 0
OP_DISABLE = 1
OP_SEND_RUNTIME_EVENT = 2
OP_SUSPEND_QUEUES = 6
OP_RESUME_QUEUES = 7
OP_QUERY_DEBUG_EVENT = 11
OP_GET_QUEUE_SNAPSHOT = 13

# enum kfd_dbg_trap_exception_code, and KFD_EC_MASK(ecode) = 1 << (ecode - 1)
EC_PROCESS_RUNTIME = 48


def ec_mask(code: int) -> int:
    return 1 << (code - 1)


# enum kfd_dbg_runtime_state
RUNTIME_DISABLED, RUNTIME_ENABLED, RUNTIME_ENABLED_BUSY, RUNTIME_ENABLED_ERROR = 0, 1, 2, 3
# per-queue status bits SUSPEND/RESUME_QUEUES set in the id array
QUEUE_ERROR_MASK = 1 << 30
QUEUE_INVALID_MASK = 1 << 31
#: Wave time allowed before preemption, in units of 1K GPU clocks; 0 keeps the driver's default.
GRACE_PERIOD = 0

IoctlFn = Callable[[int, int, ctypes.Structure], int]


def _ioctl(fd: int, request: int, arg: ctypes.Structure) -> int:
    return fcntl.ioctl(fd, request, arg, True)


class KfdDevice:
    """``/dev/kfd`` opened by this process, and the debugger calls on it.

    ``ioctl`` and ``path`` exist for tests, which put a fake KFD behind them.
    """

    def __init__(self, path: str = KFD_DEVICE, ioctl: IoctlFn = _ioctl) -> None:
        self._ioctl = ioctl
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
        self._ioctl(self.fd, AMDKFD_IOC_GET_VERSION, args)
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
            result = self._ioctl(self.fd, AMDKFD_IOC_DBG_TRAP, args)
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


# --- the daemon's side: ask the task's tracer ----------------------------------------------------


def control_address(pid: int) -> bytes:
    """The abstract socket on which the tracer of ``pid`` takes requests."""
    return f"\0gpreempt-kfd/{pid}".encode()


#: How long the daemon waits for a tracer's answer (a suspension waits for the GPU to save
#: the waves of the queues it unmaps).
REQUEST_TIMEOUT_S = 10.0


def request(pid: int, op: str, timeout: float = REQUEST_TIMEOUT_S) -> dict[str, object]:
    """Send ``op`` to the tracer of ``pid`` and return its answer.

    The tracer is proven by the kernel, not by what it says: the peer of the socket must be the
    process that ptraces ``pid`` (its parent, as ``gpreempt run``), of ``pid``'s user or root.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(control_address(pid))
        except OSError:
            raise MechanismUnavailable(
                f"process {pid} has no KFD tracer: start it with `gpreempt run --mechanism kfd`"
            ) from None
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid, peer_uid, _ = struct.unpack("3i", creds)
        if peer_pid != _tracer_process(pid) or peer_uid not in (_owner(pid), 0):
            raise MechanismFailed(
                f"the socket of process {pid}'s KFD tracer is held by process {peer_pid}, "
                "which does not trace it; refusing it"
            )
        sock.sendall(json.dumps({"op": op}).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                raise MechanismFailed(f"the KFD tracer of process {pid} hung up")
            reply += chunk
    except TimeoutError:
        raise MechanismFailed(f"the KFD tracer of process {pid} did not answer in time") from None
    finally:
        sock.close()
    answer = json.loads(reply)
    if not answer.get("ok"):
        raise MechanismFailed(str(answer.get("error") or "the KFD tracer refused"))
    return answer


def _owner(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _tracer_process(pid: int) -> int:
    """The pid of the process whose thread ptraces ``pid`` (0: none)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        tracer = int(next(x.split()[1] for x in status.splitlines() if x.startswith("TracerPid:")))
        if tracer == 0:
            return 0
        tracer_status = Path(f"/proc/{tracer}/status").read_text()
        return int(next(x.split()[1] for x in tracer_status.splitlines() if x.startswith("Tgid:")))
    except (OSError, StopIteration, ValueError):
        return 0


class KfdMechanism(Mechanism):
    """Daemon side: SIGSTOP the task's process group, then have its tracer unmap its queues."""

    name = "kfd"
    stops_process = True
    unmaps_queues = True

    def check(self, target: Target) -> None:
        try:
            read_process(target.pid)
        except NoSuchProcess as exc:
            raise MechanismUnavailable(str(exc)) from None
        request(target.pid, "ping")

    def suspend(self, target: Target) -> str:
        send(target, signal.SIGSTOP)
        try:
            request(target.pid, "suspend")
        except BaseException:
            with contextlib.suppress(NoSuchProcess):
                send(target, signal.SIGCONT)
            raise
        return self.name

    def resume(self, target: Target) -> str:
        try:
            request(target.pid, "resume")
        except MechanismUnavailable:
            pass  # no tracer any more: the kernel resumed its queues when it went away
        finally:
            with contextlib.suppress(NoSuchProcess):
                send(target, signal.SIGCONT)
        return self.name
