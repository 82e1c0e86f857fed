"""SIGSTOP/SIGCONT: stops a process's CPU side at once, on any vendor.

GPU work it already queued still drains, so this bounds nothing on its own; it is the
fallback that always works, and the only mechanism for processes with no CUDA context.
"""

from __future__ import annotations

import contextlib
import os
import signal

from ..errors import MechanismFailed, MechanismUnavailable, NoSuchProcess
from ..names import MechanismName
from ..procinfo import open_verified, read_process
from .base import Mechanism, Target


def send(target: Target, signum: int) -> None:
    """Send ``signum`` to the target's process group if it has one of its own, else to its pid.

    With a start time, the process is checked through a pidfd first and a lone process is
    signalled through that pidfd, so a recycled pid is never signalled; a group is signalled
    while its verified leader holds the group id."""
    try:
        if target.pidfd is not None:
            if target.pgid:
                signal.pidfd_send_signal(target.pidfd, 0)  # ESRCH once it has exited
                os.killpg(target.pgid, signum)
            else:
                signal.pidfd_send_signal(target.pidfd, signum)
            return
        if target.start_time is None:
            if target.pgid:
                os.killpg(target.pgid, signum)
            else:
                os.kill(target.pid, signum)
            return
        pidfd = open_verified(target.pid, target.start_time)
        try:
            if target.pgid:
                os.killpg(target.pgid, signum)
            else:
                signal.pidfd_send_signal(pidfd, signum)
        finally:
            os.close(pidfd)
    except ProcessLookupError:
        raise NoSuchProcess(f"process {target.pid} has exited") from None
    except PermissionError:
        raise MechanismFailed(
            f"not allowed to signal process {target.pid}: it belongs to another user"
        ) from None


class SignalMechanism(Mechanism):
    name = MechanismName.SIGNAL
    stops_process = True

    def check(self, target: Target) -> None:
        try:
            read_process(target.pid)
        except NoSuchProcess as exc:
            raise MechanismUnavailable(str(exc)) from None

    def suspend(self, target: Target) -> str:
        send(target, signal.SIGSTOP)
        return self.name

    def resume(self, target: Target) -> str:
        with contextlib.suppress(NoSuchProcess):
            send(target, signal.SIGCONT)
        return self.name
