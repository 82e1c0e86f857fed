"""``install_gate``, the one way to put the gate in a process, and the :class:`Gate` it returns.

:func:`install_gate` picks the implementation -- the C++ hook (:mod:`.native`, built on first
use by :mod:`.build`) or, where that cannot be built, the Python fallback (:mod:`.fallback`) --
installs it with a :class:`~.config.GateConfig`, and patches PyTorch for what the hook cannot
see (:mod:`.torch_patches`). One gate per process at a time (:func:`current_gate`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Protocol

from ...control_block import ControlBlock
from .config import ENV_NATIVE, SLOW_GATE_NOTICE, GateConfig
from .fallback import PythonGate
from .native import NativeGate
from .torch_patches import TorchPatches, cuda_initialized


class GateImpl(Protocol):
    """What both implementations, :class:`~.native.NativeGate` and
    :class:`~.fallback.PythonGate`, offer the :class:`Gate`."""

    def uninstall(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def drain(self) -> None: ...
    def set_device_live(self, live: bool) -> None: ...
    def capture_begin(self) -> None: ...
    def capture_end(self) -> None: ...
    def before_launch(self) -> None: ...
    def bind_thread(self, word_address: int, unbounded: bool) -> None: ...
    def watch(self, addresses: list[int], version: int) -> None: ...
    def set_default_task_word(self, word_address: int) -> None: ...
    def hand_activity(self, handed: bool) -> bool: ...


class Gate:
    """An installed launch gate. One per process at a time."""

    #: True if the C++ hook is active, False for the Python fallback.
    native: bool
    config: GateConfig

    def __init__(
        self, control: ControlBlock, config: GateConfig, native: bool, impl: GateImpl
    ) -> None:
        self.control = control  # keeps the mapping alive as long as the gate
        self.config = config
        self.native = native
        self._impl = impl
        self._installed = True
        self._torch_patches = TorchPatches(self)

    def uninstall(self) -> None:
        """Remove the hook; launches pass freely again. Safe to call twice."""
        global _current
        if not self._installed:
            return
        self._installed = False
        self._torch_patches.undo()
        self._impl.uninstall()
        with _install_lock:
            if _current is self:
                _current = None

    @property
    def installed(self) -> bool:
        return self._installed

    def stats(self) -> dict[str, Any]:
        """Counters: launches, waits, wait_seconds, bound_waits, window, tight, auto_active..."""
        out: dict[str, Any] = {"native": self.native}
        out.update(self._impl.stats())
        out["installed"] = self._installed
        out["config"] = asdict(self.config)
        return out

    def drain(self) -> None:
        """Wait until the GPU work this process launched so far has completed."""
        if self._installed:
            self._impl.drain()

    def warm(self) -> None:
        """Put a no-op kernel on the current CUDA stream. Entering a request does (with
        ``GPREEMPT_REQUEST_WARM=1``), so that the GPU switches from the other processes'
        contexts to this one while the request prepares, not at its first kernel. Nothing
        where CUDA is not initialised here or the stream is being captured (the kernel would
        join the graph)."""
        torch = sys.modules.get("torch")
        if not self._installed or torch is None or not cuda_initialized(torch):
            return
        with contextlib.suppress(RuntimeError):  # a request never fails for it
            if not torch.cuda.is_current_stream_capturing():
                torch.cuda._sleep(0)

    def watch(self, addresses: Sequence[int], version: int = 0) -> None:
        """Also stop while one of these control blocks (mapped read-only at these addresses)
        says its task is active; replaces the previous list, ``[]`` clears it.

        The session calls it with what the daemon sends (the blocks of the tasks that outrank
        this one), so the gate stops at its next operator when one of them starts, without
        waiting for the daemon to close it. ``version``: the daemon's number for that list
        (0 = none, or not all of it mapped); a gate the daemon closed only while the tasks of
        that very list are active goes on by itself once none is
        (:func:`gpreempt.control.released_by_watch`). The mappings must outlive their use here.
        """
        if self._installed:
            self._impl.watch(list(addresses), version)

    def bind_thread(self, word_address: int, unbounded: bool = False) -> None:
        """Make the calling thread also wait while the u32 at ``word_address`` is nonzero.

        Used by the in-process scheduler: each task's threads follow their task's word.
        ``unbounded`` keeps the thread's launches out of the in-flight window (tasks that are
        never preempted in-process). ``word_address=0`` unbinds the thread.
        """
        self._impl.bind_thread(word_address, unbounded)

    def set_default_task_word(self, word_address: int) -> None:
        """The word that threads bound to no task follow (0: none). Autograd's worker threads
        are such threads, so the backward pass of a preempted training task waits too."""
        self._impl.set_default_task_word(word_address)

    def hand_activity(self, handed: bool = True) -> bool:
        """Stop publishing this process's activity (``auto_active``), which the driver-level
        gate then publishes from every launch (``handed``), or publish it again (not handed).
        The client hands it over in a process that also runs a framework whose launches this
        gate never sees (JAX, CuPy, ...): its requests would otherwise go unseen. False where
        the gate is not installed."""
        return self._installed and self._impl.hand_activity(handed)

    # used by the torch patches
    def _mark_device_live(self) -> None:
        self._impl.set_device_live(True)

    def _before_launch(self) -> None:
        if self._installed:
            self._impl.before_launch()

    def _capture(self, begin: bool) -> None:
        if self._installed:
            if begin:
                self._impl.capture_begin()
            else:
                self._impl.capture_end()

    def __repr__(self) -> str:
        kind = "native" if self.native else "python"
        state = "installed" if self._installed else "uninstalled"
        return f"<Gate {kind} {state} bound={self.config.bound} auto={self.config.auto_activity}>"


_install_lock = threading.Lock()
_current: Gate | None = None


def current_gate() -> Gate | None:
    """The gate installed in this process, if any."""
    return _current


def install_gate(control: ControlBlock, config: GateConfig, *, prefer_native: bool = True) -> Gate:
    """Install the launch gate for this process with ``config`` and return it.

    ``config``: the settings, usually from :func:`~.config.resolve_config` (parameters, then
    the environment, then the defaults). ``prefer_native``: use the C++ hook, building it if
    needed (``GPREEMPT_GATE_NATIVE=0`` forces the Python fallback); where it cannot be built,
    the fallback is used with one line on stderr.

    Raises RuntimeError if a gate is already installed.
    """
    global _current
    import torch  # the gate hooks PyTorch; callers install it once torch is imported

    with _install_lock:
        if _current is not None and _current.installed:
            raise RuntimeError(
                "a launch gate is already installed in this process; uninstall() it first"
            )
        native_env = os.environ.get(ENV_NATIVE, "").strip().lower()
        use_native = prefer_native and native_env not in ("0", "false", "no", "off")
        impl: GateImpl | None = None
        if use_native:
            # imported here: `python -m gpreempt.client.gate.build` runs it as a script
            from .build import NativeGateUnavailable, load_native

            try:
                impl = NativeGate(load_native(), control, config)
            except NativeGateUnavailable as exc:
                print(
                    f"{SLOW_GATE_NOTICE} ({exc})",
                    file=sys.stderr,
                    flush=True,
                )
        native = impl is not None
        if impl is None:
            impl = PythonGate(control, config)
        gate = Gate(control, config, native, impl)
        gate._torch_patches.apply(torch)
        _current = gate
        return gate
