"""The CUDA driver's stream memory operations, through ctypes on ``libcuda.so.1``.

:mod:`.stream_barriers` puts waits on a process's legacy default stream from a thread of its
own, for programs that launch their work without PyTorch (the launch gate's own barriers are
in ``gate/csrc/operator_gate_barriers_cuda.cpp``). Only the few calls that needs: finding the
devices whose primary context the program made, borrowing that context on the thread, making a
control block's page readable by the GPU, and ``cuStreamWaitValue32``. Nothing here creates a
context.
"""

from __future__ import annotations

import ctypes

#: ``CU_STREAM_WAIT_VALUE_EQ`` and ``CU_STREAM_WAIT_VALUE_NOR``.
WAIT_EQ = 1
WAIT_NOR = 3
#: ``CU_STREAM_LEGACY``: the legacy default stream, which every blocking stream waits for.
LEGACY_STREAM = 0x1
_REGISTER_PORTABLE = 1
_REGISTER_DEVICEMAP = 2
_REGISTER_READ_ONLY = 8
_ALREADY_REGISTERED = 712
PAGE = 4096


class DriverCallFailed(RuntimeError):
    """A driver call returned an error."""


class CudaStreamOps:
    """The driver calls stream barriers need; one per process (:meth:`load`)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._primaries: dict[int, ctypes.c_void_p] = {}
        self._pages: dict[int, int] = {}

    @classmethod
    def load(cls) -> CudaStreamOps | None:
        """The driver's calls, or None where there is no NVIDIA driver (or it lacks them)."""
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        if not hasattr(lib, "cuStreamWaitValue32_v2") and not hasattr(lib, "cuStreamWaitValue32"):
            return None
        ops = cls(lib)
        try:
            ops._call("cuInit", ctypes.c_uint(0))
        except DriverCallFailed:
            return None
        return ops

    def _call(self, name: str, *args: object) -> None:
        code = getattr(self._lib, name)(*args)
        if code != 0:
            raise DriverCallFailed(f"{name} failed (driver error {code})")

    def _symbol(self, versioned: str, plain: str) -> str:
        return versioned if hasattr(self._lib, versioned) else plain

    def active_devices(self) -> list[int]:
        """Ordinals of the devices whose primary context is active (the program uses them)."""
        count = ctypes.c_int(0)
        self._call("cuDeviceGetCount", ctypes.byref(count))
        active = []
        for ordinal in range(count.value):
            handle, flags, on = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
            self._call("cuDeviceGet", ctypes.byref(handle), ctypes.c_int(ordinal))
            self._call("cuDevicePrimaryCtxGetState", handle, ctypes.byref(flags), ctypes.byref(on))
            if on.value:
                active.append(ordinal)
        return active

    def push_context(self, ordinal: int) -> None:
        """Make ``ordinal``'s primary context current on this thread (it must be active:
        retaining an inactive one would create it); :meth:`pop_context` takes it off."""
        primary = self._primaries.get(ordinal)
        if primary is None:
            handle = ctypes.c_int(0)
            self._call("cuDeviceGet", ctypes.byref(handle), ctypes.c_int(ordinal))
            primary = ctypes.c_void_p()
            self._call("cuDevicePrimaryCtxRetain", ctypes.byref(primary), handle)
            self._primaries[ordinal] = primary  # kept: the program holds it anyway
        self._call(self._symbol("cuCtxPushCurrent_v2", "cuCtxPushCurrent"), primary)

    def pop_context(self) -> None:
        popped = ctypes.c_void_p()
        self._call(self._symbol("cuCtxPopCurrent_v2", "cuCtxPopCurrent"), ctypes.byref(popped))

    def device_word(self, address: int, read_only: bool) -> int:
        """The device address of the host word at ``address``: its page is registered with
        the driver once, for every context, and stays registered (a queued wait may read it
        at any time), so the caller never unmaps it."""
        page = address & ~(PAGE - 1)
        device = self._pages.get(page)
        if device is None:
            flags = _REGISTER_PORTABLE | _REGISTER_DEVICEMAP
            flags |= _REGISTER_READ_ONLY if read_only else 0
            register = self._symbol("cuMemHostRegister_v2", "cuMemHostRegister")
            code = getattr(self._lib, register)(
                ctypes.c_void_p(page), ctypes.c_size_t(PAGE), ctypes.c_uint(flags)
            )
            if code not in (0, _ALREADY_REGISTERED):
                raise DriverCallFailed(f"cuMemHostRegister failed (driver error {code})")
            pointer = ctypes.c_uint64(0)
            name = self._symbol("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
            self._call(name, ctypes.byref(pointer), ctypes.c_void_p(page), ctypes.c_uint(0))
            device = self._pages[page] = pointer.value
        return device + (address - page)

    def wait32(self, device_address: int, value: int, how: int) -> None:
        """Queue a wait on the legacy default stream of the current context."""
        name = self._symbol("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        self._call(
            name,
            ctypes.c_void_p(LEGACY_STREAM),
            ctypes.c_uint64(device_address),
            ctypes.c_uint32(value & 0xFFFFFFFF),
            ctypes.c_uint(how),
        )
