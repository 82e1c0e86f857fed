"""A driver-level gate that lets CUPTI go while nothing needs it, on a real GPU.

A CUPTI subscriber slows every graph launch of its process, callbacks on or off, and only
``cuptiFinalize`` undoes that. So a task nothing preempts detaches CUPTI once it has slept a
while (``callback_mode.h``): a profiler it starts still gets its profile, and a more important
task that starts later still holds it, the gate having subscribed again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import (
    NVIDIA_GPU,
    progress_count,
    spawn,
    stands_still_through_a_request,
    stop_all,
    task_named,
    wait_for,
)
from test_driver_gate_gpu import PROFILED, SERVER_REQUEST

PROGRAMS = Path(__file__).parent / "programs"

pytestmark = NVIDIA_GPU

# A PyTorch program that launches now and then for three seconds (its gate detaches CUPTI
# meanwhile), then records a profile as PROFILED does: it prints its kernels and the gate's state.
PROFILED_LATER = (
    r"""
import time
import torch
x = torch.randn(512, 512, device="cuda")
end = time.monotonic() + 3.0
while time.monotonic() < end:
    x = torch.tanh(x @ x)
    torch.cuda.synchronize()
    time.sleep(0.02)
"""
    + PROFILED
)


def test_a_task_nothing_preempts_lets_cupti_go_and_its_profiler_still_gets_a_profile(
    daemon, runtime_dir
):
    """Under ``--priority high`` with nothing else set, its status says detached while it
    sleeps; a torch.profiler it starts afterwards records the kernels, the gate having taken
    CUPTI and let it go as for a task that never detached."""
    pytest.importorskip("torch")
    server = spawn(
        runtime_dir, "run", "--priority", "high", "--name", "server", "--",
        sys.executable, "-c", PROFILED_LATER,
    )  # fmt: skip
    seen: list[dict] = []

    def detached() -> bool:
        task = task_named(runtime_dir, "server")
        seen.append(task or {})
        return bool(task and (task.get("gate") or {}).get("driver_detached"))

    try:  # until it is seen detached, or the program is over
        wait_for(lambda: detached() or server.poll() is not None, 120, 0.1)
        out, err = server.communicate(timeout=120)
    finally:
        stop_all(server)
    assert server.returncode == 0, err
    assert any((t.get("gate") or {}).get("driver_detached") for t in seen), seen[-1:]
    kernels, state = out.split()[-2:]
    assert int(kernels) > 0, out
    print("driver gate after the profile:", state)


def test_a_detached_gate_subscribes_again_when_a_more_important_task_starts(
    daemon, runtime_dir, tmp_path, monkeypatch
):
    """A task at ``high`` runs CuPy work beside PyTorch (which its operator gate never sees)
    and detaches while nothing outranks it; a task above it then opens a request, and the
    work must stand still through it: the gate took CUPTI back and held the launches. The task
    tells no activity of its own (``GPREEMPT_AUTO_ACTIVITY=0``): one that did would keep CUPTI
    to tell it by its CuPy launches (agent.hand_activity_over)."""
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    progress, go = tmp_path / "progress", tmp_path / "go"
    worker = [sys.executable, str(PROGRAMS / "mixed_worker.py"), str(progress), "cupy", "90"]
    monkeypatch.setenv("GPREEMPT_AUTO_ACTIVITY", "0")
    trainer = spawn(runtime_dir, "run", "--priority", "high", "--name", "trainer", "--", *worker)
    monkeypatch.delenv("GPREEMPT_AUTO_ACTIVITY")
    server = None
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"

        def detached() -> bool:
            task = task_named(runtime_dir, "trainer")
            return bool(task and (task.get("gate") or {}).get("driver_detached"))

        assert wait_for(detached, 15, interval=0.1), task_named(runtime_dir, "trainer")
        print("detached:", task_named(runtime_dir, "trainer"))
        server = spawn(
            runtime_dir, "run", "--priority", "200", "--name", "server", "--",
            sys.executable, "-c", SERVER_REQUEST, str(go), "2.0",
        )  # fmt: skip
        assert wait_for(lambda: task_named(runtime_dir, "server") is not None, 30)
        time.sleep(0.5)
        try:
            held_to, task = stands_still_through_a_request(runtime_dir, go, progress)
        except AssertionError:
            print("during the request:", task_named(runtime_dir, "trainer"))
            raise
        assert task["gate"]["driver"] == "on", task
        assert not task["gate"]["driver_detached"], task
        assert wait_for(lambda: progress_count(progress) > held_to, 20), "no progress after it"
    finally:
        stop_all(trainer, *([server] if server else []))
