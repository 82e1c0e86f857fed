"""A fake ``/dev/kfd`` that answers ``AMDKFD_IOC_GET_VERSION`` and ``AMDKFD_IOC_DBG_TRAP`` as
the upstream kernel does, for the tests of mechanism ``kfd`` on a CPU.

Each rule cites where the kernel decides it (Linux ``drivers/gpu/drm/amd/amdkfd/``, mainline
6.8+; the function, and the line of code that decides). The target processes are real child
processes (the ptrace-parent rule is checked against ``/proc``); their GPU side (queues, the
ROCm runtime) is simulated by the methods under "the target's side".
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpreempt.mechanisms import kfd_abi

OP_NAMES = {
    0: "enable",
    1: "disable",
    2: "runtime-event",
    6: "suspend",
    7: "resume",
    11: "query",
    13: "snapshot",
}
NEW = kfd_abi.ec_mask(kfd_abi.EC_QUEUE_NEW)
RUNTIME = kfd_abi.ec_mask(kfd_abi.EC_PROCESS_RUNTIME)


def ioc_size(request: int) -> int:
    return (request >> 16) & 0x3FFF


def tracer_tid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return 0


def image(pid: int) -> bytes:
    """What the process runs: its command line changes at exec, its memory map with it."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@dataclass
class Queue:
    queue_id: int
    # kfd_process_queue_manager.c, init_user_queue:
    #     q_properties->exception_status = KFD_EC_MASK(EC_QUEUE_NEW);
    exception_status: int = NEW
    suspended: bool = False
    being_destroyed: bool = False


@dataclass
class Process:
    """struct kfd_process of one target: bound to its memory map (``image``)."""

    image: bytes
    runtime_state: int
    queues: dict[int, Queue] = field(default_factory=dict)
    debug_trap_enabled: bool = False
    dbg_fd: int = -1
    exception_enable_mask: int = 0
    exception_status: int = 0
    #: The runtime is blocked in AMDKFD_IOC_RUNTIME_ENABLE until the debugger answers.
    runtime_waiting: bool = False


class FakeKfd:
    """The kernel's side, over targets that run ``seed_runtime`` with queues ``queues``.

    ``fail_activation``: kfd_dbg_trap_activate fails (another session holds the GPU's debug
    VMID), as on GPUs without per-VMID debugging.
    """

    def __init__(
        self,
        version: tuple[int, int] = (1, 17),
        queues: tuple[int, ...] = (3, 5),
        runtime_state: int = kfd_abi.RUNTIME_ENABLED,
        fail_activation: bool = False,
    ) -> None:
        self.version = version
        self.seed_queues = tuple(queues)
        self.seed_runtime = runtime_state
        self.fail_activation = fail_activation
        self.processes: dict[int, Process] = {}
        self.log: list[str] = []
        self.attempts: list[int] = []  # every op asked for, allowed or not
        self.graces: list[int] = []
        self.owners: dict[int, int] = {}  # /dev/kfd descriptor -> the process that used it
        self.lock = threading.Lock()

    # --- what tests read -------------------------------------------------------------------
    @property
    def suspended(self) -> set[int]:
        procs = self.processes.values()
        return {q.queue_id for p in procs for q in p.queues.values() if q.suspended}

    def process(self, pid: int) -> Process:
        return self.processes[pid]

    # --- the target's side -----------------------------------------------------------------
    def create_process(self, pid: int, runtime_state: int | None = None) -> Process:
        """The target opened /dev/kfd (kfd_create_process), with the seeded runtime and queues."""
        state = self.seed_runtime if runtime_state is None else runtime_state
        proc = Process(image(pid), state)
        for queue_id in self.seed_queues:
            proc.queues[queue_id] = Queue(queue_id)
        self.processes[pid] = proc
        return proc

    def create_queue(self, pid: int, queue_id: int) -> None:
        """AMDKFD_IOC_CREATE_QUEUE: the new queue carries EC_QUEUE_NEW (init_user_queue)."""
        with self.lock:
            self.processes[pid].queues[queue_id] = Queue(queue_id)

    def runtime_enable(self, pid: int) -> None:
        """AMDKFD_IOC_RUNTIME_ENABLE (kfd_chardev.c, runtime_enable)."""
        with self.lock:
            proc = self.processes[pid]
            proc.runtime_state = kfd_abi.RUNTIME_ENABLED
            if proc.debug_trap_enabled:
                # if (p->debug_trap_enabled) { kfd_dbg_trap_activate(p);
                #     kfd_dbg_ev_raise(KFD_EC_MASK(EC_PROCESS_RUNTIME), ...);
                #     ... down_interruptible(&p->runtime_enable_sema); }
                self._activate(proc)
                proc.exception_status |= RUNTIME
                proc.runtime_waiting = True
                if proc.exception_enable_mask & RUNTIME:
                    os.write(proc.dbg_fd, b".")  # kfd_dbg_ev_raise: kernel_write(dbg_ev_file)

    def _activate(self, proc: Process) -> None:
        # kfd_debug.c, kfd_dbg_trap_activate: reserve_debug_trap_vmid() == -EBUSY ->
        #     runtime_state = DEBUG_RUNTIME_STATE_ENABLED_BUSY
        if self.fail_activation:
            proc.runtime_state = kfd_abi.RUNTIME_ENABLED_BUSY

    def _released_at_exec(self, pid: int) -> None:
        # kfd_process.c, kfd_process_notifier_release_internal (the old mm goes away at exec):
        #     kfd_dbg_trap_disable(p); ... the kfd_process is removed from the table
        proc = self.processes.get(pid)
        if proc is not None and proc.image != image(pid):
            del self.processes[pid]

    # --- the ioctls ------------------------------------------------------------------------
    def ioctl(self, fd: int, request: int, arg: ctypes.Structure) -> int:
        assert ioc_size(request) == ctypes.sizeof(arg), "size in the request != the struct's"
        # kfd_chardev.c, kfd_ioctl: if (process->lead_thread != current->group_leader ...)
        #     retcode = -EBADF;  ("Using KFD FD in wrong process")
        if self.owners.setdefault(fd, os.getpid()) != os.getpid():
            raise OSError(errno.EBADF, "KFD descriptor of another process")
        if request == 0x80084B01:  # AMDKFD_IOR(0x01, struct kfd_ioctl_get_version_args)
            assert ctypes.sizeof(arg) == 8
            arg.major_version, arg.minor_version = self.version
            return 0
        assert request == 0xC0204B26, hex(request)  # AMDKFD_IOWR(0x26, kfd_ioctl_dbg_trap_args)
        assert ctypes.sizeof(arg) == 32
        with self.lock:
            return self._dbg_trap(arg)

    def _dbg_trap(self, arg: ctypes.Structure) -> int:
        op, pid = arg.op, arg.pid
        self.attempts.append(op)
        # kfd_ioctl_set_debug_trap: find_get_pid / get_pid_task / get_task_mm -> -ESRCH
        if not Path(f"/proc/{pid}").exists():
            raise OSError(errno.ESRCH, "no such process")
        self._released_at_exec(pid)
        is_parent = tracer_tid(pid) == threading.get_native_id()
        proc = self.processes.get(pid)
        if proc is None:
            # create_process = ... ptrace_parent(thread) == current;
            # target = create_process ? kfd_create_process(thread) : kfd_lookup_process_by_pid
            if op == kfd_abi.OP_ENABLE and is_parent:
                proc = self.create_process(pid)
            else:
                raise OSError(errno.ESRCH, "no KFD process")
        # if (target != p && args->op != KFD_IOC_DBG_TRAP_DISABLE
        #         && ptrace_parent(target->lead_thread) != current)  r = -EPERM;
        if op != kfd_abi.OP_DISABLE and not is_parent:
            raise OSError(errno.EPERM, "not PTRACED by this thread")
        # if (args->op != KFD_IOC_DBG_TRAP_ENABLE && !target->debug_trap_enabled) r = -EINVAL;
        if op != kfd_abi.OP_ENABLE and not proc.debug_trap_enabled:
            raise OSError(errno.EINVAL, "not debug enabled")
        # if (target->runtime_info.runtime_state != DEBUG_RUNTIME_STATE_ENABLED &&
        #         (... SUSPEND_QUEUES || ... RESUME_QUEUES ...)) r = -EPERM;
        if op in (6, 7) and proc.runtime_state != kfd_abi.RUNTIME_ENABLED:
            raise OSError(errno.EPERM, "runtime not enabled")
        self.log.append(OP_NAMES[op])
        handler = {
            0: self._enable,
            1: self._disable,
            2: self._send_runtime_event,
            6: self._suspend,
            7: self._resume,
            11: self._query,
            13: self._snapshot,
        }[op]
        return handler(proc, arg)

    def _enable(self, proc: Process, arg: ctypes.Structure) -> int:
        # kfd_debug.c, kfd_dbg_trap_enable
        if proc.debug_trap_enabled:  # if (target->debug_trap_enabled) return -EALREADY;
            raise OSError(errno.EALREADY, "already debugged")
        assert arg.enable.rinfo_size == 16
        os.fstat(arg.enable.dbg_fd)  # f = fget(fd); if (!f) return -EBADF;
        proc.dbg_fd = arg.enable.dbg_fd
        if proc.runtime_state == kfd_abi.RUNTIME_ENABLED:  # else: deferred to runtime enable
            self._activate(proc)
        proc.debug_trap_enabled = True
        proc.exception_enable_mask = arg.enable.exception_mask
        info = kfd_abi.RuntimeInfo.from_address(arg.enable.rinfo_ptr)
        info.runtime_state = proc.runtime_state
        return 0

    def _disable(self, proc: Process, arg: ctypes.Structure) -> int:
        # kfd_debug.c, kfd_dbg_trap_disable
        if proc.runtime_state == kfd_abi.RUNTIME_ENABLED:
            for queue in proc.queues.values():  # kfd_dbg_trap_deactivate -> resume_queues
                queue.suspended = False
        elif proc.runtime_state != kfd_abi.RUNTIME_DISABLED:
            proc.runtime_state = kfd_abi.RUNTIME_ENABLED  # reset for re-attach
        proc.debug_trap_enabled = False
        proc.exception_status = 0  # kfd_dbg_clean_exception_status
        for queue in proc.queues.values():
            queue.exception_status = 0
        return 0

    def _send_runtime_event(self, proc: Process, arg: ctypes.Structure) -> int:
        # kfd_dbg_send_exception_to_runtime: up(&p->runtime_enable_sema); nothing else changes
        if arg.send_runtime_event.exception_mask & RUNTIME:
            proc.runtime_waiting = False
        return 0

    def _query(self, proc: Process, arg: ctypes.Structure) -> int:
        # kfd_debug.c, kfd_dbg_ev_query_debug_event: queue events, then process events;
        # return *event_status ? 0 : -EAGAIN;
        clear = arg.query_debug_event.exception_mask
        for queue in proc.queues.values():
            if proc.exception_enable_mask & queue.exception_status:
                arg.query_debug_event.exception_mask = queue.exception_status
                arg.query_debug_event.queue_id = queue.queue_id
                queue.exception_status &= ~clear
                return 0
        if proc.exception_enable_mask & proc.exception_status:
            arg.query_debug_event.exception_mask = proc.exception_status
            proc.exception_status &= ~clear
            return 0
        raise OSError(errno.EAGAIN, "no event")

    def _snapshot(self, proc: Process, arg: ctypes.Structure) -> int:
        # kfd_process_queue_manager.c, pqm_get_queue_snapshot -> set_queue_snapshot_entry:
        #     qss_entry->exception_status = q->properties.exception_status; ...
        #     q->properties.exception_status &= ~exception_clear_mask;
        snap = arg.queue_snapshot
        assert snap.entry_size == 64
        for i, queue in enumerate(list(proc.queues.values())[: snap.num_queues]):
            entry = kfd_abi.QueueSnapshotEntry.from_address(snap.snapshot_buf_ptr + 64 * i)
            entry.queue_id = queue.queue_id
            entry.exception_status = queue.exception_status
            queue.exception_status &= ~snap.exception_mask
        snap.num_queues = len(proc.queues)
        return 0

    def _suspend(self, proc: Process, arg: ctypes.Structure) -> int:
        # kfd_device_queue_manager.c, suspend_queues: q_array_invalidate(...), then per queue
        # suspend_single_queue: if (is_new || q->properties.is_being_destroyed) return -EBUSY;
        # (the id keeps KFD_DBG_QUEUE_INVALID_MASK); an already suspended queue counts again
        args = arg.suspend_queues
        self.graces.append(args.grace_period)
        ids = (ctypes.c_uint32 * args.num_queues).from_address(args.queue_array_ptr)
        done = 0
        for i, queue_id in enumerate(list(ids)):
            ids[i] = queue_id | kfd_abi.QUEUE_INVALID_MASK
            queue = proc.queues.get(queue_id)
            if queue is None:
                continue
            if not queue.suspended and (queue.exception_status & NEW or queue.being_destroyed):
                continue
            queue.suspended = True
            queue.exception_status &= ~args.exception_mask
            ids[i] = queue_id
            done += 1
        return done

    def _resume(self, proc: Process, arg: ctypes.Structure) -> int:
        # kfd_device_queue_manager.c, resume_queues: invalid unless the queue exists
        args = arg.resume_queues
        ids = (ctypes.c_uint32 * args.num_queues).from_address(args.queue_array_ptr)
        done = 0
        for i, queue_id in enumerate(list(ids)):
            queue = proc.queues.get(queue_id)
            if queue is None:
                ids[i] = queue_id | kfd_abi.QUEUE_INVALID_MASK
                continue
            queue.suspended = False
            done += 1
        return done
