"""The ``kfd`` mechanism: suspend an AMD GPU task's queues through the KFD debugger interface.

``AMDKFD_IOC_DBG_TRAP`` (KFD ioctl 1.13, the debugger API) lets the *ptrace parent* of a
process unmap its user-mode queues (``SUSPEND_QUEUES``) and map them again
(``RESUME_QUEUES``). The hardware saves the waves that were running (CWSR, compute wave
save/restore) and restores them on resume, so unlike a launch gate or the NVIDIA driver lock
this stops work already queued on the GPU, not only the next submission. The kernel allows it
to the tracer thread alone, so ``gpreempt run --mechanism kfd`` traces its command with
``PTRACE_SEIZE`` (see :mod:`gpreempt.tracer`) and performs the calls on that thread when the
daemon asks through a socket private to the launcher.

The ABI (:mod:`.kfd_abi`) is copied from the upstream kernel's
``include/uapi/linux/kfd_ioctl.h``; the calls (:mod:`.kfd_device`, :mod:`.kfd_session`) follow
``drivers/gpu/drm/amd/amdkfd/kfd_chardev.c`` (``kfd_ioctl_set_debug_trap``), ``kfd_debug.c``
and ``kfd_device_queue_manager.c``, in the order ROCdbgapi uses them (``src/process.cpp``,
``src/os_driver.cpp``); this module holds the daemon's side and the mechanism. Nothing here has
run on AMD hardware yet; ``gpreempt selftest`` checks it on the user's machine.

Kernel rules this code follows:

* ``/dev/kfd`` is usable only by the process that opened it (EBADF otherwise); the tracer
  opens its own.
* Every op but ``DISABLE`` needs the caller to be ``ptrace_parent`` of the target's main thread
  (EPERM otherwise), and every op but ``ENABLE`` needs ``ENABLE`` first (EINVAL otherwise);
  a second ``ENABLE`` answers EALREADY.
* A debug session belongs to the target's memory map: the kernel ends it when the target
  execs (``kfd_process_notifier_release_internal`` calls ``kfd_dbg_trap_disable``). The tracer
  opens it only after the command's exec and forgets it at any later exec.
* Every queue carries ``EC_QUEUE_NEW`` from its creation until a queue snapshot clears it,
  and ``SUSPEND_QUEUES`` refuses such a queue; every snapshot clears it.
* ``SUSPEND_QUEUES``/``RESUME_QUEUES`` need the target's ROCm runtime to be enabled for
  debugging (``AMDKFD_IOC_RUNTIME_ENABLE``, at ``hsa_init``; EPERM before, and EPERM for good
  when activation failed: ``RUNTIME_ENABLED_BUSY``/``ERROR``). A runtime that enables itself
  while a session is open waits until the debugger answers with
  ``SEND_RUNTIME_EVENT(EC_PROCESS_RUNTIME)``; the tracer answers at once.
* ``DISABLE`` resumes every queue still suspended, and the kernel disables every session of a
  debugger process that exits, however it exits: a queue is never left suspended by a
  launcher that dies.
* Queues created after a suspension are not suspended; the mechanism also stops the task's
  CPU side (SIGSTOP of its process group) so that it creates none meanwhile.

When the tracer cannot suspend, the task stays stopped by SIGSTOP (as mechanism ``signal``)
rather than run; a suspension that held none of the task's queues is reported as a
degradation (an event and a counter) and the task is held by signals from then on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

from ..errors import GpreemptError, MechanismFailed, MechanismUnavailable, NoSuchProcess
from ..names import MechanismName
from ..procinfo import read_process
from .base import Mechanism, MechanismSettings, Target
from .signal import send

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

    name = MechanismName.KFD
    stops_process = True
    unmaps_queues = True

    def __init__(self) -> None:
        #: Why the last suspension of a pid held less than kfd promises (taken by the daemon).
        self._notes: dict[int, str] = {}
        #: Tasks (pid, start time) whose queues kfd could not hold: signals only, from then on.
        self._signal_only: set[tuple[int, int | None]] = set()

    @classmethod
    def create(cls, settings: MechanismSettings, others: Mapping[str, Mechanism]) -> Mechanism:
        from .kfd_session import check_available  # opens /dev/kfd: only when built

        check_available()
        return cls()

    @classmethod
    def undo_leftovers(cls, target: Target) -> None:
        """Have the task's tracer (its launcher) map its queues again. A tracer that does not
        answer leaves nothing to undo: the kernel maps the queues of a debug session whose
        tracer exited."""
        with contextlib.suppress(GpreemptError):
            request(target.pid, "resume")

    def check(self, target: Target) -> None:
        try:
            read_process(target.pid)
        except NoSuchProcess as exc:
            raise MechanismUnavailable(str(exc)) from None
        request(target.pid, "ping")

    def suspend(self, target: Target) -> str:
        """Stop the task's CPU side, then its queues. Whatever fails after the SIGSTOP, the
        task stays stopped: the suspension is then one by signal (see :meth:`take_degradation`)."""
        send(target, signal.SIGSTOP)
        key = (target.pid, target.start_time)
        if key in self._signal_only:
            return MechanismName.SIGNAL
        try:
            answer = request(target.pid, "suspend")
        except (MechanismFailed, MechanismUnavailable) as exc:
            self._undo(target)
            self._notes[target.pid] = f"kfd failed, held by SIGSTOP only: {exc}"
            return MechanismName.SIGNAL
        held, queues = _count(answer, "suspended"), _count(answer, "queues")
        if queues and not held:
            self._forget_gone()
            self._signal_only.add(key)
            self._notes[target.pid] = (
                f"kfd suspended none of the task's {queues} GPU queues (refused: "
                f"{answer.get('refused')}); held by SIGSTOP only, from now on"
            )
            return MechanismName.SIGNAL
        if held < queues:
            self._notes[target.pid] = f"kfd suspended {held} of the task's {queues} GPU queues"
        return self.name

    def take_degradation(self, target: Target) -> str | None:
        return self._notes.pop(target.pid, None)

    def _undo(self, target: Target) -> None:
        """After a failed suspension: map again whatever the tracer did unmap."""
        with contextlib.suppress(MechanismFailed, MechanismUnavailable):
            request(target.pid, "resume", timeout=2.0)

    def _forget_gone(self) -> None:
        self._signal_only = {k for k in self._signal_only if os.path.exists(f"/proc/{k[0]}")}

    def resume(self, target: Target) -> str:
        try:
            request(target.pid, "resume")
        except MechanismUnavailable:
            pass  # no tracer any more: the kernel resumed its queues when it went away
        finally:
            with contextlib.suppress(NoSuchProcess):
                send(target, signal.SIGCONT)
        return self.name


def _count(answer: dict[str, object], key: str) -> int:
    value = answer.get(key, 0)
    return value if isinstance(value, int) else 0
