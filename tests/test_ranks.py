"""Which GPU a rank of a multi-process job uses, from what its launcher put in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import gp_env, process_state, spawn, stop_all, tasks, wait_for

from gpreempt.client.connection import DaemonClient
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


def test_a_gpu_two_processes_added_stays_until_both_are_gone() -> None:
    task = _task((0,))
    assert task.add_gpu(1, 7) and task.add_gpu(2, 7)  # one process, two GPUs
    assert not task.add_gpu(1, 8)  # another process on one of them: not new
    assert not task.add_gpu(0, 8)  # registered on it
    task.drop_rank(7)
    assert task.gpus == (0, 1)
    task.drop_rank(8)
    assert task.gpus == (0,)


def test_a_rank_names_only_a_gpu_its_process_can_use(tmp_path) -> None:
    from gpreempt.procinfo import can_use_gpu

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


DRIVES_GPUS = """
import struct, sys
from gpreempt.client.connection import DaemonClient
from gpreempt.control import OFF_DEVICES
from gpreempt.control_block import ControlBlock
block = ControlBlock.create()
client = DaemonClient.connect(sys.argv[1])
register = {"priority": "low", "name": "dp", "mechanism": sys.argv[2]}
client.open_channel(block.memfd, block.doorbell, register=register)
print("ready", flush=True)
for line in sys.stdin:  # the GPUs its driver-level gate saw a context made on, as it writes them
    struct.pack_into("<Q", block._map, OFF_DEVICES, sum(1 << int(g) for g in line.split()))
    block.ring()
    print("rung", flush=True)
"""


def test_a_process_that_drives_several_gpus_counts_its_task_on_each(
    daemon, runtime_dir: Path
) -> None:
    """The driver-level gate names the GPUs its process made a context on: the daemon counts
    the task on each (registered on GPU 0 by default) while the process lives."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVES_GPUS, str(runtime_dir), "auto"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=gp_env(runtime_dir),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"

        def gpus() -> list[int]:
            with DaemonClient.connect(runtime_dir) as client:
                tasks = client.status()["tasks"]
            return next(t["gpus"] for t in tasks if t["name"] == "dp")

        assert gpus() == [0]
        for line, expected in (("0", [0]), ("0 1 3", [0, 1, 3])):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "rung"
            assert wait_for(lambda expected=expected: gpus() == expected, 5), gpus()
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


#: argv: the file that says go, the request's length in seconds, a file that ends it early.
SERVER_ON_GPU_1 = """
import pathlib, sys, time
import gpreempt
go, release = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[3])
while not go.exists():
    time.sleep(0.01)
with gpreempt.request():
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end and not release.exists():
        time.sleep(0.01)
time.sleep(600)
"""


def test_a_server_stops_a_process_that_drives_its_gpu_too(daemon, runtime_dir: Path, tmp_path):
    """A low task registered on GPU 0 runs on while a server's request is open on GPU 1, until
    its process says it drives GPU 1 too: then the request stops it (signals), and it goes on
    once the request ends."""
    dp = subprocess.Popen(
        [sys.executable, "-c", DRIVES_GPUS, str(runtime_dir), "signal"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=gp_env(runtime_dir),
    )  # fmt: skip
    assert dp.stdin is not None and dp.stdout is not None
    go, release = tmp_path / "go", tmp_path / "release"
    server = spawn(
        runtime_dir, "run", "--priority", "high", "--gpu", "1", "--name", "server", "--",
        sys.executable, "-c", SERVER_ON_GPU_1, str(go), "30", str(release),
    )  # fmt: skip

    def server_active() -> bool:
        with DaemonClient.connect(runtime_dir) as client:
            tasks = client.status()["tasks"]
        return any(t["name"] == "server" and t["active"] for t in tasks)

    try:
        assert dp.stdout.readline().strip() == "ready"
        assert wait_for(lambda: any(t["name"] == "server" for t in tasks(runtime_dir)), 10)
        go.touch()
        assert wait_for(server_active, 10), "the server's request did not open"
        time.sleep(0.5)  # the request is open, on another GPU: the low task runs on
        assert process_state(dp.pid) != "T"
        dp.stdin.write("0 1\n")
        dp.stdin.flush()
        assert dp.stdout.readline().strip() == "rung"
        assert wait_for(lambda: process_state(dp.pid) == "T", 5), "not stopped for GPU 1"
        release.touch()  # the request ends
        assert wait_for(lambda: process_state(dp.pid) not in ("T", ""), 15), "not resumed"
    finally:
        stop_all(server)
        dp.kill()
        dp.wait(timeout=10)
