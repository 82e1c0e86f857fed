"""The KFD debugger interface's ABI, as mechanism ``kfd`` uses it: ioctl numbers, argument
structures and constants, copied from the upstream kernel's ``include/uapi/linux/kfd_ioctl.h``
(see :mod:`gpreempt.mechanisms.kfd` for the kernel rules the calls follow)."""

from __future__ import annotations

import ctypes
import fcntl
from collections.abc import Callable

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
#: Set on every queue at creation (kfd_process_queue_manager.c, init_user_queue), debugged or
#: not, and cleared only by a queue snapshot or suspension that names it in its clear mask
#: (kfd_device_queue_manager.c, set_queue_snapshot_entry). While it is set,
#: suspend_single_queue refuses the queue (-EBUSY: the id comes back with QUEUE_INVALID_MASK).
EC_QUEUE_NEW = 31
EC_PROCESS_RUNTIME = 48


def ec_mask(code: int) -> int:
    """KFD_EC_MASK(code)."""
    return 1 << (code - 1)


# enum kfd_dbg_runtime_state (kfd_debug.c): ENABLED_BUSY and ENABLED_ERROR mean the runtime
# enabled itself but kfd_dbg_trap_activate failed (a debug VMID held by another session, CU
# masking); SUSPEND/RESUME_QUEUES then answer EPERM (kfd_chardev.c, kfd_ioctl_set_debug_trap).
RUNTIME_DISABLED, RUNTIME_ENABLED, RUNTIME_ENABLED_BUSY, RUNTIME_ENABLED_ERROR = 0, 1, 2, 3
RUNTIME_STATE_NAMES = {
    RUNTIME_DISABLED: "RUNTIME_DISABLED",
    RUNTIME_ENABLED: "RUNTIME_ENABLED",
    RUNTIME_ENABLED_BUSY: "RUNTIME_ENABLED_BUSY",
    RUNTIME_ENABLED_ERROR: "RUNTIME_ENABLED_ERROR",
}
# per-queue status bits SUSPEND/RESUME_QUEUES set in the id array
QUEUE_ERROR_MASK = 1 << 30
QUEUE_INVALID_MASK = 1 << 31
#: Grace periods of SUSPEND_QUEUES, in units of 1K GPU clocks (kfd_ioctl.h). The kernel writes
#: the value into CP_IQ_WAIT_TIME2.SCH_WAVE for the unmap unless it is USE_DEFAULT_GRACE_PERIOD
#: (0xffffffff, kfd_device_queue_manager.h), and turns 0 into 1, the shortest the CP takes
#: (kfd_packet_manager.c, pm_config_dequeue_wait_counts: "the debugger API ... sets 0 and expects
#: a low value"). So 0 preempts at once, 0xffffffff lets waves run the driver's default first.
GRACE_IMMEDIATE = 0
GRACE_DEFAULT = 0xFFFFFFFF
#: What gpreempt asks for: preempt at once, as ROCdbgapi does (os_driver.cpp,
#: kfd_driver_t::suspend_queues). On a GPU scheduled by the HWS (not MES: MI200/MI300 are HWS)
#: the unmap takes every user queue of every process on the device off the hardware and maps
#: the others again (execute_queues_cpsch with KFD_UNMAP_QUEUES_FILTER_DYNAMIC_QUEUES), so
#: this grace applies to the queues of the other processes on that GPU too (docs/amd.md).
GRACE_PERIOD = GRACE_IMMEDIATE

IoctlFn = Callable[[int, int, ctypes.Structure], int]


def ioctl(fd: int, request: int, arg: ctypes.Structure) -> int:
    return fcntl.ioctl(fd, request, arg, True)
