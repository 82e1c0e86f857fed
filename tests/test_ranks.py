"""Which GPU a rank of a multi-process job uses, from what its launcher put in its environment."""

from __future__ import annotations

import os

import pytest

from gpreempt.client.ranks import rank_gpu
from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.field_checks import MAX_GPUS


@pytest.mark.parametrize(
    ("environ", "gpu"),
    [
        ({}, None),  # not a rank
        ({"RANK": "3", "WORLD_SIZE": "4"}, None),  # a rank, but not told its place on the node
        ({"LOCAL_RANK": "1", "RANK": "5"}, 1),  # torchrun
        ({"SLURM_LOCALID": "2"}, 2),  # srun
        ({"LOCAL_RANK": "0", "SLURM_LOCALID": "3"}, 0),  # torchrun inside an srun allocation
        ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,6"}, 6),
        ({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": " 4, 6 "}, 6),
        ({"LOCAL_RANK": "1", "HIP_VISIBLE_DEVICES": "2,3"}, 3),  # AMD
        ({"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "4,6"}, None),  # fewer GPUs than ranks
        ({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-8a1f2c3d-0000"}, None),  # by UUID
        ({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": ""}, None),  # no GPU visible
        ({"LOCAL_RANK": "x"}, None),
        ({"LOCAL_RANK": "-1"}, None),
    ],
)
def test_a_ranks_gpu_follows_the_launchers_conventions(environ: dict, gpu: int | None) -> None:
    assert rank_gpu(environ) == gpu


def _task(gpus: tuple[int, ...]) -> Task:
    return Task(TaskIdentity(
        task_id=1, pid=10, pgid=None, start_time=1, uid=0, name="job", priority=-100,
        gpus=gpus, mechanism="auto",
    ))  # fmt: skip


def test_a_task_is_counted_on_each_gpu_its_ranks_use_once() -> None:
    task = _task((0,))
    for conn, gpu in enumerate((1, 0, 3, 1)):
        task.add_gpu(gpu, conn)
    assert task.gpus == (0, 1, 3)  # the GPU it was registered on stays first


def test_a_gpu_a_rank_added_goes_when_the_rank_does() -> None:
    task = _task((0,))
    task.add_gpu(2, 7)
    task.drop_rank(8)  # another connection: nothing changes
    assert task.gpus == (0, 2)
    task.drop_rank(7)
    assert task.gpus == (0,)


def test_a_rank_names_only_a_gpu_its_process_can_use(tmp_path) -> None:
    from gpreempt.daemon.handlers import can_use_gpu

    nodes = {n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit()}
    if not nodes:
        assert can_use_gpu(os.getpid(), 5)  # no NVIDIA node at all: nothing to tell
    else:
        assert not can_use_gpu(os.getpid(), 10_000)
    assert not can_use_gpu(2**22 + 1, 0)  # no such process


def test_a_task_counts_no_more_gpus_than_a_registration_may_name() -> None:
    task = _task(tuple(range(MAX_GPUS)))
    task.add_gpu(MAX_GPUS + 5, 1)
    assert len(task.gpus) == MAX_GPUS
