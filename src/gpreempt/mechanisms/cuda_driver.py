"""The NVIDIA driver's process checkpoint API, through ctypes on ``libcuda.so.1``.

``cuCheckpointProcessLock`` stops another process's CUDA calls and returns once its
submitted work has completed; ``Unlock`` lets it go on. ``Checkpoint`` moves a locked
process's device memory to host memory and frees it; ``Restore`` brings it back. The API
needs driver r570 or newer and does not cover MPS clients, MIG, managed memory, CUDA IPC
or NCCL jobs. ctypes keeps this usable with nothing installed but the driver.
"""

from __future__ import annotations

import ctypes
import enum
import threading

from ..errors import GpreemptError, MechanismFailed, MechanismUnavailable


class ProcessState(enum.IntEnum):
    """``CUprocessState``."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


class _LockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class _Reserved64(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class _RestoreArgs(ctypes.Structure):
    _fields_ = [
        ("gpuPairs", ctypes.c_void_p),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * 44),
        ("reserved1", ctypes.c_uint64),
    ]


#: CUresult codes worth naming in messages.
_RESULTS = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    401: "CUDA_ERROR_ILLEGAL_STATE",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    909: "CUDA_ERROR_TIMEOUT",
    999: "CUDA_ERROR_UNKNOWN",
}
TIMEOUT = 909
NOT_SUPPORTED = 801
INVALID_VALUE = 1


class CudaDriverError(MechanismFailed):
    """A checkpoint call returned an error; ``code`` is the CUresult."""

    def __init__(self, call: str, pid: int, code: int) -> None:
        name = _RESULTS.get(code, f"CUresult {code}")
        super().__init__(f"{call}(pid {pid}) failed: {name}")
        self.code = code


class CheckpointDriver:
    """The checkpoint functions of libcuda, loaded and initialised once per process."""

    _instance: CheckpointDriver | None = None
    _instance_lock = threading.Lock()

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise MechanismUnavailable(
                f"the NVIDIA driver library {library} could not be loaded ({exc}); "
                "the lock mechanism needs an NVIDIA GPU and driver"
            ) from None
        for name in (
            "cuCheckpointProcessLock",
            "cuCheckpointProcessUnlock",
            "cuCheckpointProcessGetState",
            "cuCheckpointProcessCheckpoint",
            "cuCheckpointProcessRestore",
        ):
            if not hasattr(self._lib, name):
                raise MechanismUnavailable(
                    f"this NVIDIA driver has no {name}: the driver checkpoint API needs "
                    "driver r570 or newer"
                )
        code = self._lib.cuInit(0)
        if code != 0:
            raise MechanismUnavailable(
                f"cuInit failed with {_RESULTS.get(code, code)}: no usable NVIDIA GPU here"
            )

    @classmethod
    def get(cls) -> CheckpointDriver:
        """The shared instance; raises MechanismUnavailable where the API is missing."""
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def state(self, pid: int) -> ProcessState:
        value = ctypes.c_int(-1)
        code = self._lib.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(value))
        if code != 0:
            raise CudaDriverError("cuCheckpointProcessGetState", pid, code)
        return ProcessState(value.value)

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = _LockArgs(timeoutMs=timeout_ms)
        code = self._lib.cuCheckpointProcessLock(ctypes.c_int(pid), ctypes.byref(args))
        if code != 0:
            raise CudaDriverError("cuCheckpointProcessLock", pid, code)

    def unlock(self, pid: int) -> None:
        args = _Reserved64()
        code = self._lib.cuCheckpointProcessUnlock(ctypes.c_int(pid), ctypes.byref(args))
        if code != 0:
            raise CudaDriverError("cuCheckpointProcessUnlock", pid, code)

    def checkpoint(self, pid: int) -> None:
        args = _Reserved64()
        code = self._lib.cuCheckpointProcessCheckpoint(ctypes.c_int(pid), ctypes.byref(args))
        if code != 0:
            raise CudaDriverError("cuCheckpointProcessCheckpoint", pid, code)

    def restore(self, pid: int) -> None:
        args = _RestoreArgs()
        code = self._lib.cuCheckpointProcessRestore(ctypes.c_int(pid), ctypes.byref(args))
        if code != 0:
            raise CudaDriverError("cuCheckpointProcessRestore", pid, code)


def try_driver() -> CheckpointDriver | None:
    """The driver if its checkpoint API is usable here, else None."""
    try:
        return CheckpointDriver.get()
    except MechanismUnavailable:
        return None


def release_process(pid: int) -> None:
    """Restore (if checkpointed) and unlock a process the driver holds; nothing where the
    checkpoint API is missing or the driver does not know the process. Used by whoever finds
    a process left held: a new daemon, or a launcher whose daemon went away."""
    driver = try_driver()
    if driver is None:
        return
    try:
        state = driver.state(pid)
    except GpreemptError:
        return
    if state == ProcessState.CHECKPOINTED:
        driver.restore(pid)
        state = driver.state(pid)
    if state == ProcessState.LOCKED:
        driver.unlock(pid)
