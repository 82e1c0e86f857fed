"""The tracer's side of mechanism ``kfd``: one debugging session of one task
(:class:`KfdSession`), run by ``gpreempt run``'s tracer thread (:mod:`gpreempt.tracer`) over
the ``/dev/kfd`` calls of :mod:`.kfd_device`. The kernel rules these calls follow are listed
in :mod:`gpreempt.mechanisms.kfd`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import GpreemptError, MechanismFailed
from .kfd_abi import (
    QUEUE_ERROR_MASK,
    QUEUE_INVALID_MASK,
    RUNTIME_ENABLED_BUSY,
    RUNTIME_ENABLED_ERROR,
    RUNTIME_STATE_NAMES,
)
from .kfd_device import KfdDevice, check_available, explain

__all__ = ["KfdDevice", "KfdSession", "SuspendOutcome", "check_available", "explain"]


@dataclass
class SuspendOutcome:
    """What a suspension held: the daemon degrades to signals when it held none of many."""

    #: Queues of the task suspended now.
    suspended: int
    #: Queues the task has (its last snapshot).
    queues: int
    #: Ids the kernel refused to suspend (new or being destroyed: QUEUE_INVALID_MASK).
    refused: list[int] = field(default_factory=list)


class KfdSession:
    """The debug session on one traced process, driven from its tracer thread only.

    The session starts at the first suspension after the command's ``exec`` (the process has
    a KFD context by then if it uses the GPU) and ends with :meth:`close`, which resumes
    everything. The kernel ends it by itself when the process execs again: the session
    belongs to the process's memory map (kfd_process.c, kfd_process_notifier_release_internal
    calls kfd_dbg_trap_disable); :meth:`on_exec` forgets it, and the next suspension opens a
    new one on the new program.
    """

    def __init__(
        self,
        pid: int,
        device_factory: Callable[[], KfdDevice] = KfdDevice,
        awaiting_exec: bool = False,
    ) -> None:
        self.pid = pid
        self._factory = device_factory
        self._device: KfdDevice | None = None
        self._events_r = self._events_w = -1
        self.suspended: list[int] = []
        #: The process is ``gpreempt run``'s wrapper, before it execs the command: a session
        #: opened now would end at that exec, so none is opened until :meth:`on_exec`.
        self.awaiting_exec = awaiting_exec

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
        if info.runtime_state in (RUNTIME_ENABLED_BUSY, RUNTIME_ENABLED_ERROR):
            # the runtime is up but kfd_dbg_trap_activate failed (kfd_debug.c): every
            # SUSPEND_QUEUES would answer EPERM. Not a wait: there is nothing to answer.
            with contextlib.suppress(MechanismFailed):
                device.disable(self.pid)
            device.close()
            self._close_pipe()
            state = RUNTIME_STATE_NAMES[info.runtime_state]
            raise MechanismFailed(
                f"the KFD debugger could not be activated on process {self.pid} ({state}: "
                "another session holds this GPU's debug VMID, or the task masks CUs); its "
                "queues cannot be suspended"
            )
        self._device = device
        return device

    def answer_events(self) -> None:
        """Release the target's runtime if it waits for the debugger (see the module doc of
        :mod:`gpreempt.mechanisms.kfd`): it would wait forever otherwise."""
        with contextlib.suppress(OSError):
            while os.read(self._events_r, 64):
                pass
        if self._device is not None and self._device.runtime_event_pending(self.pid):
            self._device.release_runtime(self.pid)

    def suspend(self) -> SuspendOutcome:
        """Suspend every queue of the process; says how many it holds of how many."""
        if self.awaiting_exec:
            return SuspendOutcome(0, 0)  # the wrapper: no GPU queues, SIGSTOP holds it
        device = self._start()
        self.answer_events()
        queues = device.queues(self.pid)  # clears EC_QUEUE_NEW, which would make them refused
        refused = self._suspend_ids(device, [q.queue_id for q in queues])
        # a thread that was inside AMDKFD_IOC_CREATE_QUEUE when the SIGSTOP came makes its
        # queue after the snapshot: one more snapshot finds it and clears its EC_QUEUE_NEW,
        # and those refused as new are asked again (ROCdbgapi also snapshots until stable)
        queues = device.queues(self.pid)
        again = [q.queue_id for q in queues if q.queue_id not in self.suspended]
        if again:
            refused = self._suspend_ids(device, again)
        return SuspendOutcome(len(self.suspended), len(queues), refused)

    def _suspend_ids(self, device: KfdDevice, ids: list[int]) -> list[int]:
        """Suspend the ids not suspended yet; returns those the kernel refused."""
        fresh = [i for i in ids if i not in self.suspended]
        if not fresh:
            return []
        _, statuses = device.suspend(self.pid, fresh)
        refused = []
        for queue_id, status in zip(fresh, statuses, strict=True):
            if status & QUEUE_ERROR_MASK:
                self.resume()
                raise MechanismFailed(
                    f"the GPU failed to suspend queue {queue_id} of process {self.pid}"
                )
            if status & QUEUE_INVALID_MASK:
                refused.append(queue_id)
            else:
                self.suspended.append(queue_id)
        return refused

    def resume(self) -> int:
        """Resume the queues :meth:`suspend` suspended; returns how many it resumed."""
        if self._device is None or not self.suspended:
            self.suspended = []
            return 0
        ids, self.suspended = self.suspended, []
        count, _ = self._device.resume(self.pid, ids)
        return count

    def on_exec(self) -> None:
        """The process exec'd (PTRACE_EVENT_EXEC): the kernel ended the session with the old
        program and its queues went with it. Forget both; nothing is sent (the new program
        has no session to disable)."""
        self.awaiting_exec = False
        device, self._device = self._device, None
        self.suspended = []
        if device is not None:
            device.close()
        self._close_pipe()

    def close(self) -> None:
        """Resume everything and end the session (also when the process is gone)."""
        with contextlib.suppress(GpreemptError):
            self.answer_events()  # a runtime left waiting for the debugger would never go on
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
