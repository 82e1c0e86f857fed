"""The driver-level gate on a real GPU: programs the operator hook never sees are held.

Each program runs under ``gpreempt run --priority low`` with nothing else set, writes the
progress it makes *on the GPU* to a file (a counter in host-mapped memory that its kernels
bump, or its completed steps), and is held by hand (``gpreempt suspend``): its progress must
stand still while held, the daemon must not have needed the driver lock nor found a leak, and
it must go on once resumed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    NVIDIA_GPU,
    Daemon,
    gpreempt,
    progress_count,
    spawn,
    stands_still_through_a_request,
    stop_all,
    wait_for,
)

PROGRAMS = Path(__file__).parent / "programs"

pytestmark = NVIDIA_GPU


def _stands_still(path: Path, seconds: float = 0.2) -> bool:
    before = progress_count(path)
    time.sleep(seconds)
    return progress_count(path) == before


def _task(runtime_dir: Path, name: str) -> dict:
    reply = gpreempt(runtime_dir, "status", "--json")
    assert reply.returncode == 0, reply.stderr
    tasks = json.loads(reply.stdout)["tasks"]
    return next(t for t in tasks if t["name"] == name)


@pytest.fixture(scope="module")
def kernel_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        pytest.skip("no nvcc")
    out = tmp_path_factory.mktemp("bin") / "kernel_loop"
    subprocess.run(
        [nvcc, "-O2", "-std=c++17", str(PROGRAMS / "kernel_loop.cu"), "-o", str(out)],
        check=True,
    )
    return out


def _held_and_resumed(runtime_dir: Path, progress: Path, command: list[str]) -> dict:
    proc = spawn(runtime_dir, "run", "--priority", "low", "--name", "trainer", "--", *command)
    try:
        if not wait_for(lambda: progress_count(progress) > 0, 100):
            proc.kill()
            pytest.fail(f"no progress: {proc.communicate(timeout=10)[1]}")
        time.sleep(0.5)
        moving = progress_count(progress)
        time.sleep(0.3)
        assert progress_count(progress) > moving, "the program makes no progress before the hold"
        # what was queued behind the last barrier may finish
        return _hold(runtime_dir, progress, settle_s=0.5, still_s=1.5)
    finally:
        stop_all(proc)


def _hold(runtime_dir: Path, progress: Path, settle_s: float, still_s: float) -> dict:
    """Hold the trainer by hand; its progress from ``settle_s`` after the hold to ``still_s``
    later, and its task then; it must go on once resumed."""
    assert gpreempt(runtime_dir, "suspend", "trainer").returncode == 0
    time.sleep(settle_s)
    held_from = progress_count(progress)
    time.sleep(still_s)
    held_to = progress_count(progress)
    task = _task(runtime_dir, "trainer")
    assert gpreempt(runtime_dir, "resume", "trainer").returncode == 0
    assert wait_for(lambda: progress_count(progress) > held_to, 20), "no progress after resume"
    return {"held_from": held_from, "held_to": held_to, "task": task}


def _assert_held(result: dict) -> None:
    task = result["task"]
    assert task["gate"]["driver"] == "on", task
    assert result["held_to"] == result["held_from"], result
    assert task["gate"]["hold_leaks"] == 0, task
    assert not task["backstop_locked"], task


@pytest.mark.parametrize("mode", ["default", "streams", "threads", "graph"])
def test_a_cuda_cpp_program_is_held(daemon, runtime_dir, tmp_path, kernel_loop, mode):
    progress = tmp_path / "progress"
    result = _held_and_resumed(runtime_dir, progress, [str(kernel_loop), str(progress), mode, "60"])
    _assert_held(result)


@pytest.mark.parametrize("framework", ["cupy", "jax", "torch-compile"])
def test_work_beside_torch_is_held(daemon, runtime_dir, tmp_path, framework):
    pytest.importorskip("torch")
    pytest.importorskip("cupy" if framework == "cupy" else "torch")
    if framework == "jax":
        pytest.importorskip("jax")
    progress = tmp_path / "progress"
    command = [sys.executable, str(PROGRAMS / "mixed_worker.py"), str(progress), framework, "90"]
    _assert_held(_held_and_resumed(runtime_dir, progress, command))


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("program", ["cpp", "cupy-devices", "jax-devices"])
def test_a_process_driving_several_gpus_is_held_on_each(
    daemon, runtime_dir, tmp_path, request, program
):
    """One process, every GPU (single-process data parallelism): each GPU's context has its
    own default stream, streams and events, and the hold must stop the work on all of them
    (the progress counted is their sum)."""
    progress = tmp_path / "progress"
    if program == "cpp":
        kernel_loop = request.getfixturevalue("kernel_loop")
        command = [str(kernel_loop), str(progress), "devices", "60"]
    else:
        pytest.importorskip("torch")
        pytest.importorskip(program.split("-")[0])
        command = [sys.executable, str(PROGRAMS / "mixed_worker.py"), str(progress), program, "90"]
    result = _held_and_resumed(runtime_dir, progress, command)
    _assert_held(result)
    assert result["task"]["gpus"] == list(range(_gpu_count())), result["task"]


PROFILED = """
import sys, torch
x = torch.randn(512, 512, device="cuda")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        x = torch.tanh(x @ x)
    torch.cuda.synchronize()
kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
from gpreempt.client.gate import driver
print(len(kernels), driver.state())
"""


def test_a_profiler_in_a_gated_process_gets_its_profile(daemon, runtime_dir):
    pytest.importorskip("torch")
    reply = gpreempt(
        runtime_dir, "run", "--priority", "low", "--", sys.executable, "-c", PROFILED, timeout=180
    )
    assert reply.returncode == 0, reply.stderr
    kernels, state = reply.stdout.split()[-2:]
    assert int(kernels) > 0, reply.stdout
    print("driver gate after the profile:", state)


def _beside_an_idle_server(
    runtime_dir: Path,
    progress: Path,
    kernel_loop: Path,
    mode: str,
    seconds: float = 60,
    server: tuple[str, ...] = ("sleep", "60"),
):
    """A more important task (``server``, by default one that never uses the GPU) and
    ``kernel_loop MODE`` as the trainer, each under ``gpreempt run`` with nothing else set."""
    server_process = spawn(
        runtime_dir, "run", "--priority", "high", "--name", "server", "--", *server
    )
    trainer = spawn(
        runtime_dir, "run", "--priority", "low", "--name", "trainer", "--",
        str(kernel_loop), str(progress), mode, str(seconds),
    )  # fmt: skip
    return server_process, trainer


@pytest.fixture
def daemon_never_sleeping(runtime_dir: Path):
    """A daemon that never lets a gate sleep, as beside a server busy now and then."""
    daemon = Daemon(runtime_dir, "--sleep-after-s", "0")
    yield daemon
    daemon.stop()


def test_beside_an_idle_server_the_gate_sleeps_and_its_thread_puts_barriers(
    daemon, runtime_dir, tmp_path, kernel_loop
):
    """Once the more important task has been idle for a second, the gate's callbacks go off
    (but for a moment every half second, to see new streams) and its thread puts a stream
    barrier every millisecond."""
    progress = tmp_path / "progress"
    procs = _beside_an_idle_server(runtime_dir, progress, kernel_loop, "default")
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"
        gate = lambda: _task(runtime_dir, "trainer")["gate"]  # noqa: E731
        assert wait_for(lambda: gate()["driver_asleep"], 10), gate()
        first = gate()
        time.sleep(0.5)
        then = gate()
        assert then["driver_asleep"], then
        assert then["driver_barriers"] > first["driver_barriers"] + 200, (first, then)
    finally:
        stop_all(*reversed(procs))


def test_an_asleep_gate_puts_no_barrier_while_its_program_launches_nothing(
    daemon, runtime_dir, tmp_path, kernel_loop
):
    """A barrier on a stream with nothing queued would hold nothing, and each costs the other
    processes on the GPU a switch to this one: asleep, the thread puts none while the program
    is alive but idle."""
    progress = tmp_path / "progress"
    procs = _beside_an_idle_server(runtime_dir, progress, kernel_loop, "idle", seconds=5)
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"
        gate = lambda: _task(runtime_dir, "trainer")["gate"]  # noqa: E731
        assert wait_for(lambda: gate()["driver_asleep"], 10), gate()
        busy = gate()["driver_barriers"]
        time.sleep(0.3)
        assert gate()["driver_barriers"] > busy + 100, gate()  # its loop keeps work queued
        assert wait_for(lambda: _stands_still(progress), 10, 0), "the loop did not end"
        idle = gate()
        time.sleep(0.5)
        assert gate()["driver_barriers"] == idle["driver_barriers"], (idle, gate())
    finally:
        stop_all(*reversed(procs))


def _launches_seen_per_kernel(runtime_dir: Path, progress: Path, seconds: float) -> float:
    """Of the trainer's kernels that ran in ``seconds``, the share its gate's callbacks saw."""
    gate = _task(runtime_dir, "trainer")["gate"]
    count = progress_count(progress)
    time.sleep(seconds)
    seen = _task(runtime_dir, "trainer")["gate"]["driver_launches"] - gate["driver_launches"]
    return seen / max(1, progress_count(progress) - count)


def test_an_awake_gate_paces_a_program_that_keeps_pace_and_a_request_still_holds_it(
    daemon_never_sleeping, runtime_dir, tmp_path, kernel_loop, monkeypatch
):
    """Under a daemon that never lets a gate sleep, the gate of a program whose CPU keeps pace
    with its GPU switches its callbacks off (paced): they see almost none of its launches, its
    thread puts the barriers, and a request still holds it, with no leak, the GPU-side check
    dating the barriers that held it. Pacing is asked for (GPREEMPT_DRIVER_PACED=1): it is off
    by default."""
    monkeypatch.setenv("GPREEMPT_DRIVER_PACED", "1")
    progress, go = tmp_path / "progress", tmp_path / "go"
    server = (sys.executable, "-c", SERVER_REQUEST, str(go), "2.0")
    procs = _beside_an_idle_server(runtime_dir, progress, kernel_loop, "paced", server=server)
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"
        gate = lambda: _task(runtime_dir, "trainer")["gate"]  # noqa: E731
        assert wait_for(lambda: gate()["driver_paced"], 10), gate()
        barriers = gate()["driver_barriers"]
        # the callbacks are on for 5 ms in 500 (new streams): about 1 %
        assert _launches_seen_per_kernel(runtime_dir, progress, 1.0) < 0.1, gate()
        assert gate()["driver_paced"] and not gate()["driver_asleep"], gate()
        assert gate()["driver_barriers"] > barriers + 500, gate()  # one every 0.2 ms queued
        held_to, task = stands_still_through_a_request(runtime_dir, go, progress)
        assert wait_for(lambda: progress_count(progress) > held_to, 20), "no progress after it"
        # the barriers that held it, dated by the GPU-side check once they passed
        assert wait_for(lambda: gate()["barriers_checked"] > 0, 5), gate()
    finally:
        stop_all(*reversed(procs))


def test_an_awake_gate_keeps_its_callbacks_for_a_program_that_queues_in_bursts(
    daemon_never_sleeping, runtime_dir, tmp_path, kernel_loop, monkeypatch
):
    """A program that queues 2 ms of GPU work in a moment would leave its thread's barriers
    2 ms apart: a trial, where one starts with so much in flight, fails at its first such span,
    the callbacks come back on, and the next trial waits 4 s (pacing asked for, as above)."""
    monkeypatch.setenv("GPREEMPT_DRIVER_PACED", "1")
    progress = tmp_path / "progress"
    procs = _beside_an_idle_server(runtime_dir, progress, kernel_loop, "default")
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"
        time.sleep(0.5)  # its first trial, if one started, failed
        assert _launches_seen_per_kernel(runtime_dir, progress, 2.0) > 0.9
    finally:
        stop_all(*reversed(procs))


def test_a_program_that_queues_far_ahead_is_held_within_a_fraction_of_its_queue(
    daemon, runtime_dir, tmp_path, kernel_loop
):
    """Beside an idle server the gate sleeps; a program that keeps a quarter second of work
    queued (as JAX and CuPy run ahead) gets its thread's barriers every 0.25 ms, or wakes it
    where the spans between them stay too long, and a hold stops it within a fraction of that
    queue either way."""
    progress = tmp_path / "progress"
    procs = _beside_an_idle_server(runtime_dir, progress, kernel_loop, "deep")
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"
        time.sleep(3.0)  # asleep after a second, with dense barriers or woken by the backlog
        # far less than the 0.25 s the program keeps queued
        result = _hold(runtime_dir, progress, settle_s=0.1, still_s=1.0)
        task = result["task"]
        assert result["held_to"] == result["held_from"], result
        assert task["gate"]["driver_barriers"] > 0, task
        assert task["gate"]["hold_leaks"] == 0, task
    finally:
        stop_all(*reversed(procs))


SERVER_REQUEST = """
import pathlib, sys, time
import gpreempt
go, seconds = pathlib.Path(sys.argv[1]), float(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
with gpreempt.request():
    time.sleep(seconds)
time.sleep(120)
"""

# A CuPy kernel that spins on the GPU for `ns` nanoseconds.
CUPY_SPIN = r"""
import cupy
spin = cupy.RawKernel(r'''
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}''', "spin")
device = cupy.cuda.Device()
"""

# A server that marks no requests (no PyTorch, so no operator gate either): its driver-level
# gate tells its activity from its launches, and the trainer's barriers wait on that word. It
# keeps three batches of a millisecond queued, waiting for the oldest before it queues the
# next, so it has no idle gap (one longer than its idle grace of 0.2 ms would rightly let the
# trainer run) unless its CPU stalls for more than two milliseconds; its kernel is compiled
# and run once before, so that its first batch starts at once.
SERVER_LAUNCHES = (
    CUPY_SPIN
    + r"""
import collections, pathlib, sys, time
go, seconds = pathlib.Path(sys.argv[1]), float(sys.argv[2])
spin((1,), (1,), (cupy.uint64(1000),)); device.synchronize()
while not go.exists():
    time.sleep(0.005)
end, queued = time.monotonic() + seconds, collections.deque()
while time.monotonic() < end:
    for _ in range(10):
        spin((1,), (1,), (cupy.uint64(100_000),))
    queued.append(cupy.cuda.Event())
    queued[-1].record()
    if len(queued) > 2:
        queued.popleft().synchronize()
device.synchronize()
time.sleep(120)
"""
)


# The same server in a process that imports PyTorch first (for its tokenizer, say): its
# operator gate sees none of CuPy's work, so the driver-level gate tells its activity
# (agent.hand_activity_over).
SERVER_LAUNCHES_BESIDE_TORCH = "import torch\ntorch.zeros(1, device='cuda')\n" + SERVER_LAUNCHES


def _stands_still_while_a_server_is_active(
    runtime_dir: Path,
    tmp_path: Path,
    command: list[str],
    server_gpu: int | None = None,
    server_program: str = SERVER_REQUEST,
) -> None:
    """The trainer ``command`` (run with no option, its progress in ``tmp_path/progress``)
    stands still while a server (on ``server_gpu``, else the default) is active for two
    seconds, with no leak, and goes on after. The server opens a request (or, with another
    ``server_program``, launches work)."""
    progress, go = tmp_path / "progress", tmp_path / "go"
    where = [] if server_gpu is None else ["--gpu", str(server_gpu)]
    server = spawn(
        runtime_dir, "run", "--priority", "high", *where, "--name", "server", "--",
        sys.executable, "-c", server_program, str(go), "2.0",
    )  # fmt: skip
    trainer = spawn(runtime_dir, "run", "--priority", "low", "--name", "trainer", "--", *command)
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"
        if server_gpu is not None:  # the trainer's process told the daemon it uses that GPU

            def counted_there() -> bool:
                return server_gpu in _task(runtime_dir, "trainer")["gpus"]

            assert wait_for(counted_there, 10), _task(runtime_dir, "trainer")
        time.sleep(1.5)  # the server idle: the trainer's gate falls asleep
        held_to, task = stands_still_through_a_request(runtime_dir, go, progress)
        assert task["gate"]["driver"] == "on", task
        assert wait_for(lambda: progress_count(progress) > held_to, 20), "no progress after it"
    finally:
        stop_all(trainer, server)


SERVERS = {
    "request": SERVER_REQUEST,
    "launches": SERVER_LAUNCHES,
    "launches-beside-torch": SERVER_LAUNCHES_BESIDE_TORCH,
}


@pytest.mark.parametrize("server_marks", list(SERVERS))
@pytest.mark.parametrize("framework", ["cupy", "jax"])
def test_work_beside_torch_stands_still_while_a_server_is_active(
    daemon, runtime_dir, tmp_path, framework, server_marks
):
    """No hold by hand: a more important task opens a request (or, marking none, launches
    work for two seconds, with PyTorch in its process or not), and the trainer's stream
    barriers must hold its GPU work until it ends. Its driver-level gate checks on the GPU
    that they do (barrier_leaks: work that passed a barrier whose task stayed active)."""
    pytest.importorskip("torch")
    pytest.importorskip(framework)
    if server_marks != "request":
        pytest.importorskip("cupy")
    program = SERVERS[server_marks]
    progress = str(tmp_path / "progress")
    command = [sys.executable, str(PROGRAMS / "mixed_worker.py"), progress, framework, "90"]
    _stands_still_while_a_server_is_active(runtime_dir, tmp_path, command, server_program=program)


@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs")
def test_a_process_driving_several_gpus_stands_still_while_a_server_on_one_is_active(
    runtime_dir, tmp_path, daemon, kernel_loop
):
    """The trainer is registered with no option (on the first GPU); its process drives every
    GPU, which its driver-level gate tells the daemon, so a server's request on the last GPU
    holds it."""
    command = [str(kernel_loop), str(tmp_path / "progress"), "devices", "60"]
    last = _gpu_count() - 1
    _stands_still_while_a_server_is_active(runtime_dir, tmp_path, command, server_gpu=last)


def test_a_program_that_resets_its_gpu_is_held_in_its_new_context(
    runtime_dir, tmp_path, daemon, kernel_loop
):
    """cudaDeviceReset destroys the context the gate knew the streams, events and registered
    words of: the gate forgets them, and its barriers hold the work of the new context."""
    command = [str(kernel_loop), str(tmp_path / "progress"), "reset", "60"]
    _stands_still_while_a_server_is_active(runtime_dir, tmp_path, command)


SPIN_SERVER = (
    CUPY_SPIN
    + r"""
import time
spin((1,), (1,), (cupy.uint64(1000),)); device.synchronize()
time.sleep(3)  # its warm-up's activity has dropped
print("launch", time.time(), flush=True)
spin((1,), (1,), (cupy.uint64(500_000_000),))  # half a second
device.synchronize()
print("done", time.time(), flush=True)
time.sleep(3)
"""
)


def test_a_server_without_torch_stays_active_for_its_grace_after_its_work(
    daemon, runtime_dir, monkeypatch
):
    """A program without PyTorch that preempts others is active from its launch until its GPU
    work has completed and the grace has passed since: the grace counts from the completion,
    not from the last launch (a kernel longer than the grace would end it at once)."""
    pytest.importorskip("cupy")
    monkeypatch.setenv("GPREEMPT_IDLE_GRACE_MS", "400")
    server = spawn(
        runtime_dir, "run", "--priority", "high", "--name", "server", "--",
        sys.executable, "-c", SPIN_SERVER,
    )  # fmt: skip
    try:
        out, err = server.communicate(timeout=120)
    finally:
        stop_all(server)
    assert server.returncode == 0, err
    marks = {word: float(t) for word, t in (line.split() for line in out.splitlines())}
    events = [json.loads(line) for line in (runtime_dir / "events.jsonl").read_text().splitlines()]
    mine = [e for e in events if e.get("task") == "server" and e["event"] in ("active", "idle")]
    rose = [e["t"] for e in mine if e["event"] == "active" and e["t"] >= marks["launch"] - 0.05]
    fell = [e["t"] for e in mine if e["event"] == "idle" and e["t"] >= marks["launch"]]
    assert rose and fell, mine
    assert rose[0] < marks["done"] - 0.2, (marks, mine)  # active while the kernel ran
    assert 0.3 <= fell[0] - marks["done"] <= 2.0, (marks, mine)  # its grace after it
