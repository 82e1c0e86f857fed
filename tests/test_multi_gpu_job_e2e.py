"""With a real daemon: a data-parallel job started by torchrun under one `gpreempt run` is one
task on every GPU its ranks use, and a request on one rank's GPU stops every rank at once and
lets them all go on together; the job trains exactly what it trains undisturbed.

DistributedDataParallel over gloo on CPU processes stands in for NCCL on GPUs: a rank stopped
alone would leave the other waiting inside its all-reduce.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HOLDING_SERVER, Counter, Daemon, spawn, status, stop_all, wait_for

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this PyTorch has no gloo backend", allow_module_level=True)

#: Two ranks train until a stop file appears (they agree on the step through an all-reduce),
#: each writing its step count; rank 0 saves the weights and the number of steps.
#: argv: out dir, stop file (or "-" to stop after STEPS), STEPS.
DDP_JOB = """
import os, sys, time, pathlib
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

out, stop, steps = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.Generator().manual_seed(rank)
progress, tmp = out / f"progress-{rank}", out / f"progress-{rank}.tmp"
step = 0
while True:
    done = torch.tensor([float(stop != "-" and os.path.exists(stop) or step >= steps)])
    dist.all_reduce(done)
    if done.item():
        break
    x = torch.randn(32, 64, generator=data)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    tmp.write_text(str(step))
    os.replace(tmp, progress)
    time.sleep(0.002)
if rank == 0:
    torch.save({"steps": step, "weights": model.module.state_dict()}, out / "result.pt")
dist.barrier()
dist.destroy_process_group()
# gloo aborts a process whose peer closes its sockets first (a race at exit, with or without
# gpreempt): leave only once both have closed their group
(out / f"closed-{rank}").touch()
while not all((out / f"closed-{peer}").exists() for peer in (0, 1)):
    time.sleep(0.01)
"""

TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")


def _job_task(runtime_dir: Path) -> dict:
    return next((t for t in status(runtime_dir)["tasks"] if t["name"] == "job"), {})


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["auto", "signal"])
def test_a_request_on_one_ranks_gpu_stops_every_rank_together(
    runtime_dir: Path, tmp_path: Path, mechanism: str
) -> None:
    job_script, server_script = tmp_path / "job.py", tmp_path / "server.py"
    job_script.write_text(DDP_JOB)
    server_script.write_text(HOLDING_SERVER)
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    go, inside, release = tmp_path / "go", tmp_path / "inside", tmp_path / "release"
    ranks = [Counter(out / f"progress-{rank}") for rank in (0, 1)]
    alone = tmp_path / "alone"
    alone.mkdir()
    reference: subprocess.Popen | None = None

    daemon = Daemon(runtime_dir)
    low = ("run", "-p", "low", "--name", "job", "-m", mechanism, "--gpu", "0", "--")
    job = spawn(runtime_dir, *low, sys.executable, *TORCHRUN, str(job_script), str(out),
                str(stop), "1000000")  # fmt: skip
    high = ("run", "-p", "high", "--name", "srv", "--gpu", "1", "--")
    server = spawn(runtime_dir, *high, sys.executable, str(server_script), str(runtime_dir),
                   str(go), str(inside), "30", str(release))  # fmt: skip
    try:
        # registered on GPU 0, its rank 1 says it uses GPU 1: the job counts on both
        assert wait_for(lambda: _job_task(runtime_dir).get("gpus") == [0, 1], 60)
        assert _job_task(runtime_dir)["processes"] >= 2
        assert wait_for(lambda: all(r.value() > 20 for r in ranks), 60)

        go.touch()  # a request on GPU 1 only
        assert wait_for(inside.exists, 20)
        time.sleep(0.3)
        held = [r.value() for r in ranks]
        time.sleep(0.6)
        assert [r.value() for r in ranks] == held, "a rank ran on during the request"
        # stopped at the same step, or one step apart (one waits in its all-reduce for the other)
        assert abs(held[0] - held[1]) <= 1

        release.touch()
        assert wait_for(lambda: not inside.exists(), 10)
        assert wait_for(lambda: all(r.progress_over(0.2) > 0 for r in ranks), 10), (
            "the ranks did not all go on after the request"
        )
        stop.touch()
        # rank 0 saved its result before it closed its group: the same job undisturbed, for as
        # many steps, starts while this one and the daemon end
        assert wait_for((out / "closed-0").exists, 60), job.communicate()
        result = torch.load(out / "result.pt")
        reference = subprocess.Popen(
            [sys.executable, *TORCHRUN, str(job_script), str(alone), "-", str(result["steps"])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert job.wait(60) == 0, job.communicate()
    except BaseException:
        if reference is not None:
            reference.kill()
            reference.wait()
        raise
    finally:
        stop.touch()
        stop_all(server)
        if job.poll() is None:
            stop_all(job)
        daemon.stop()

    assert result["steps"] > 40
    _out, err = reference.communicate(timeout=120)
    assert reference.returncode == 0, err[-3000:]
    undisturbed = torch.load(alone / "result.pt")
    assert undisturbed["steps"] == result["steps"]
    for name, tensor in undisturbed["weights"].items():
        assert torch.equal(tensor, result["weights"][name]), name
