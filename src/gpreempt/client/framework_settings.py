"""What ``gpreempt run`` sets for the frameworks in a command that may be preempted.

The gates hold a program between its launches: a kernel already launched runs to its end, and
so does a CUDA graph. XLA launches most of a JAX step as one graph (its "command buffers"), so
a JAX trainer was held only between whole steps: beside a ResNet-50 server the driver-level
gate learned 1.3 ms of GPU work per launch, each request waited for the step in flight (the
server's service time at P99 2.3-2.5 ms against 1.4-1.5 alone), and the trainer took GPU time
the server was counted busy for. With command buffers off it launches its kernels one by one
(0.08 ms each), is held between them (1.5-1.7 ms), and trains alone as fast as with them
(776 against 768 steps/s): benchmarks/driver_gate/results/h100/xla-graphs.

So a task below ``high`` gets ``--xla_gpu_enable_command_buffer=`` (off) in its ``XLA_FLAGS``,
unless the flag is already there (the user's choice stands) or
``GPREEMPT_XLA_COMMAND_BUFFERS=1`` (which an XLA older than the flag, late 2023, needs: it
refuses flags it does not know). Nothing else in the program changes: the flag tunes how XLA
submits the same computation.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import ENV_XLA_COMMAND_BUFFERS, env_switch
from ..priority import NAMED

XLA_FLAGS = "XLA_FLAGS"
#: XLA's flag (an empty list: off).
COMMAND_BUFFER_FLAG = "--xla_gpu_enable_command_buffer"


def framework_settings(env: Mapping[str, str], priority: int) -> dict[str, str]:
    """The variables to set in the environment ``env`` of a command of a task of this
    priority (empty where none): XLA's command buffers off below ``high``. UsageError for a
    ``GPREEMPT_XLA_COMMAND_BUFFERS`` that is no switch."""
    if priority >= NAMED["high"] or env_switch(ENV_XLA_COMMAND_BUFFERS, env):
        return {}
    flags = env.get(XLA_FLAGS, "")
    if COMMAND_BUFFER_FLAG in flags:
        return {}
    return {XLA_FLAGS: f"{flags} {COMMAND_BUFFER_FLAG}=".strip()}
