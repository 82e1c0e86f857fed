"""The binding to the C++ gate: one object whose methods call the extension's functions.

The extension (``csrc/operator_gate*``, built by :mod:`gpreempt.client.gate.build`) is installed
with the control block's address, its doorbell and the :class:`~.config.GateConfig` itself:
the C++ side reads the config's fields by their names, so the knobs have one name and one
default, both on the Python side.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ...control_block import ControlBlock
from .config import GateConfig
from .torch_patches import cuda_initialized


class NativeGate:
    """The C++ RecordFunction hook, installed in this process."""

    def __init__(self, module: ModuleType, control: ControlBlock, config: GateConfig) -> None:
        import torch

        self._module = module
        module.install(control.address, control.doorbell, config, cuda_initialized(torch))
        if config.barrier_ms > 0 and config.bound:
            control.keep_mapped()
            module.set_barriers(config.barrier_ms, hip=bool(getattr(torch.version, "hip", None)))

    def uninstall(self) -> None:
        self._module.uninstall()

    def stats(self) -> dict[str, Any]:
        return dict(self._module.stats())

    def drain(self) -> None:
        self._module.drain()

    def set_device_live(self, live: bool) -> None:
        self._module.set_device_live(live)

    def capture_begin(self) -> None:
        self._module.capture_begin()

    def capture_end(self) -> None:
        self._module.capture_end()

    def before_launch(self) -> None:
        self._module.before_launch()

    def bind_thread(self, word_address: int, unbounded: bool) -> None:
        self._module.bind_thread(word_address, unbounded)

    def watch(self, addresses: list[int], version: int) -> None:
        self._module.watch(addresses, version)

    def set_default_task_word(self, word_address: int) -> None:
        self._module.set_default_task_word(word_address)

    def hand_activity(self, handed: bool) -> bool:
        return bool(self._module.hand_activity(handed))
