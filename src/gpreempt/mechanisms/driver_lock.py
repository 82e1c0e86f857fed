"""The ``lock`` mechanism: the NVIDIA driver's process lock.

Locking a process blocks its further CUDA calls and waits until the work it already
submitted has finished, so once :meth:`suspend` returns the task has nothing left on the
GPU. It works on any CUDA process, PyTorch or not, with no code change.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import MechanismFailed, MechanismUnavailable
from ..names import MechanismName
from .base import Mechanism, MechanismSettings, Target
from .cuda_driver import CheckpointDriver, CudaDriverError, ProcessState, release_process

#: How long one lock call may wait for a process's queued work to finish.
DEFAULT_LOCK_TIMEOUT_MS = 5000


class DriverLockMechanism(Mechanism):
    name = MechanismName.LOCK
    holds_driver_lock = True
    instead = "Use --mechanism signal (or auto, which falls back to signal)."

    def __init__(self, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None:
        self.timeout_ms = timeout_ms
        self._driver: CheckpointDriver | None = None

    @classmethod
    def create(cls, settings: MechanismSettings, others: Mapping[str, Mechanism]) -> Mechanism:
        timeout_ms = settings.lock_timeout_ms
        lock = cls() if timeout_ms is None else cls(timeout_ms)
        lock.driver  # noqa: B018 - loads libcuda and checks the API, or says why not
        return lock

    @property
    def driver(self) -> CheckpointDriver:
        if self._driver is None:
            self._driver = CheckpointDriver.get()
        return self._driver

    @classmethod
    def undo_leftovers(cls, target: Target) -> None:
        """Restore the process if it was checkpointed, and unlock it."""
        release_process(target.pid)

    def state(self, target: Target) -> ProcessState:
        return self.driver.state(target.pid)

    def check(self, target: Target) -> None:
        try:
            self.state(target)
        except CudaDriverError as exc:
            raise MechanismUnavailable(
                f"the driver cannot lock process {target.pid} ({exc}); it has no CUDA context "
                "yet, runs under MPS, or uses a feature the checkpoint API does not support"
            ) from None

    def suspend(self, target: Target) -> str:
        if self.state(target) == ProcessState.LOCKED:
            return self.name
        self.driver.lock(target.pid, self.timeout_ms)
        return self.name

    def resume(self, target: Target) -> str:
        try:
            state = self.state(target)
        except CudaDriverError:
            return self.name  # the process exited or dropped its context: nothing to unlock
        if state == ProcessState.LOCKED:
            self.driver.unlock(target.pid)
        elif state == ProcessState.CHECKPOINTED:
            raise MechanismFailed(
                f"process {target.pid} is checkpointed (its memory is on the host): "
                "restore it with `gpreempt restore` before resuming"
            )
        return self.name
