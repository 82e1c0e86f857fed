"""The in-process launch gate (L1): lets the daemon stop this process's GPU launches.

``install_gate(control, config)`` hooks every PyTorch operator of the process. Before each one
the gate reads the control block's ``gate_closed`` word (one plain load: no syscall, no lock);
while the word is set it launches nothing. Optionally it also

* **bounds the work in flight** (``bound=True``, for tasks that may be preempted): it records a
  CUDA event every few launches and, when more work than the window is outstanding, waits for
  the oldest event. The window is counted both in launches and in GPU time learned from the
  events' timestamps. It is *tight* (``window_ms`` of GPU work) while a more important task is
  around -- from the moment the gate was last closed until ``tight_hold_ms`` later -- and *open*
  (``open_window_ms``) otherwise, because a tight window makes the CPU lockstep with the GPU and
  costs throughput while it protects nobody;
* **detects the process's own GPU activity** (``auto_activity=True``, for the tasks that preempt
  others): the first launch after idling publishes ``auto_active=1`` and rings the doorbell; a
  background thread publishes ``auto_active=0`` once all the work has completed and
  ``idle_grace_ms`` has passed.

The modules, in the order a reader needs them:

* :mod:`.config` -- :class:`GateConfig`, the one object that names the knobs and their
  defaults, and :func:`resolve_config` (parameters, then ``GPREEMPT_GATE_*``, then defaults);
* :mod:`.install` -- :func:`install_gate` and the :class:`Gate` it returns;
* :mod:`.native` -- the binding to the C++ ``RecordFunction`` hook in ``csrc/operator_gate*``,
  which :mod:`.build` compiles on first use (``python -m gpreempt.client.gate.build``
  prebuilds it);
* :mod:`.fallback` (and :mod:`.fallback_inflight`) -- the same algorithm as a Python
  ``TorchDispatchMode``, used where no compiler is available, at a much higher cost per
  operator and only for the thread that installed it (and the autograd threads serving it);
* :mod:`.torch_patches` -- what the gate patches in PyTorch (CUDA init, graph capture/replay).

Launches PyTorch operators do not make are invisible to the gate: kernels inside a CUDA graph
replay (the replay itself is gated when it goes through ``torch.cuda.CUDAGraph.replay``),
custom extensions calling CUDA directly. The daemon's driver lock backstops those.
"""

from __future__ import annotations

from .config import (
    ENV_BARRIER_MS,
    ENV_HOLD_MS,
    ENV_K,
    ENV_MODE,
    ENV_NATIVE,
    ENV_OP_COSTS,
    ENV_OPEN_WINDOW_MS,
    ENV_W,
    ENV_WINDOW_MS,
    MODES,
    POLL_US,
    RUN_BARRIER_MS,
    GateConfig,
    resolve_config,
)
from .install import Gate, current_gate, install_gate

__all__ = [
    "ENV_BARRIER_MS",
    "ENV_HOLD_MS",
    "ENV_K",
    "ENV_MODE",
    "ENV_NATIVE",
    "ENV_OPEN_WINDOW_MS",
    "ENV_OP_COSTS",
    "ENV_W",
    "ENV_WINDOW_MS",
    "MODES",
    "POLL_US",
    "RUN_BARRIER_MS",
    "Gate",
    "GateConfig",
    "current_gate",
    "install_gate",
    "resolve_config",
]
