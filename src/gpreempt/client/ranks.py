"""The GPU a rank of a multi-process job uses, read from its launcher's environment.

``torchrun`` (``python -m torch.distributed.run``), ``accelerate``, DeepSpeed's launcher and
Slurm's ``srun`` start one process per GPU and tell each its place on the node in
``LOCAL_RANK`` (``SLURM_LOCALID`` under srun); by convention the process then uses the
LOCAL_RANK-th visible GPU (``torch.cuda.set_device(local_rank)``). Each process reports that
GPU when it opens its channel, and the daemon counts its task on it: the ranks a launcher
started under one ``gpreempt run`` join one task, which then counts on every GPU they use, so
a more important task on any of them stops the whole job, every rank at once (README,
"Multi-GPU jobs"). Under srun each rank runs ``gpreempt run`` itself: a task per rank, each on
its GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Where launchers put a process's place among the processes of its node, in the order read.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID")
#: The GPUs a process may see, by physical index (NVIDIA's, then AMD's), in the order read.
VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def rank_gpu(environ: Mapping[str, str] | None = None) -> int | None:
    """The physical index of the GPU this rank uses, or None if it is no rank or its GPU
    cannot be told (``CUDA_VISIBLE_DEVICES`` naming GPUs by UUID, or too few of them)."""
    env = os.environ if environ is None else environ
    local = next((env[name] for name in LOCAL_RANK_VARIABLES if env.get(name)), None)
    if local is None or not local.strip().isdigit():
        return None
    index = int(local)
    visible = next((env[name] for name in VISIBLE_VARIABLES if name in env), None)
    if visible is None:
        return index
    entries = [entry.strip() for entry in visible.split(",")]
    if index >= len(entries) or not entries[index].isdigit():
        return None
    return int(entries[index])
