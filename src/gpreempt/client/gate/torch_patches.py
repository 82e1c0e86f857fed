"""What the gate patches in PyTorch: the launches and states its operator hook cannot see.

A ``RecordFunction`` callback (or the fallback's dispatch mode) sees operators, not CUDA
initialisation, graph capture or graph replay. :class:`TorchPatches` wraps
``torch.cuda.CUDAGraph.capture_begin``/``capture_end``/``replay`` and registers a lazy CUDA
init callback so the gate learns of them, and undoes the wrapping when the gate is removed.
"""

from __future__ import annotations

from typing import Any, Protocol


class PatchedGate(Protocol):
    """What the patches call on the installed gate."""

    @property
    def installed(self) -> bool: ...

    def _mark_device_live(self) -> None: ...

    def _before_launch(self) -> None: ...

    def _capture(self, begin: bool) -> None: ...


def cuda_initialized(torch: Any) -> bool:
    """Whether CUDA is available and already initialised here (the gate never initialises it)."""
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


class TorchPatches:
    """Tells the gate what RecordFunction cannot see: CUDA init, graph capture and replay."""

    def __init__(self, gate: PatchedGate) -> None:
        self._gate = gate
        self._undo: list[tuple[Any, str, Any]] = []

    def apply(self, torch: Any) -> None:
        gate = self._gate
        try:
            if torch.cuda.is_available():
                torch.cuda._lazy_call(lambda: gate.installed and gate._mark_device_live())
        except Exception:
            pass
        graph_cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
        if graph_cls is None:
            return
        for name in ("capture_begin", "capture_end", "replay"):
            original = graph_cls.__dict__.get(name)
            if original is None:
                continue
            self._undo.append((graph_cls, name, original))
            setattr(graph_cls, name, _wrap_graph_method(gate, name, original))

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def _wrap_graph_method(gate: PatchedGate, name: str, original: Any) -> Any:
    if name == "capture_begin":

        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            gate._capture(True)
            try:
                return original(self, *args, **kwargs)
            except BaseException:
                gate._capture(False)
                raise

        return capture_begin
    if name == "capture_end":

        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(self, *args, **kwargs)
            finally:
                gate._capture(False)

        return capture_end

    def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        gate._before_launch()
        return original(self, *args, **kwargs)

    return replay
