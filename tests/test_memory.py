"""Memory eviction's decisions and refusals, with a fake driver and fake memory readings."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpreempt.daemon.apply_memory import MemoryExecutor
from gpreempt.daemon.memory import GpuMemory, MemoryMover
from gpreempt.daemon.registry import Registry
from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.errors import MechanismFailed, MechanismUnavailable, UsageError
from gpreempt.mechanisms.cuda_driver import ProcessState

GiB = 1 << 30


class FakeDriver:
    def __init__(self) -> None:
        self.states: dict[int, ProcessState] = {}
        self.calls: list[tuple[str, int]] = []
        self.fail_restore = False

    def state(self, pid: int) -> ProcessState:
        return self.states.get(pid, ProcessState.RUNNING)

    def lock(self, pid: int, timeout_ms: int) -> None:
        self.calls.append(("lock", pid))
        self.states[pid] = ProcessState.LOCKED

    def checkpoint(self, pid: int) -> None:
        self.calls.append(("checkpoint", pid))
        self.states[pid] = ProcessState.CHECKPOINTED

    def restore(self, pid: int) -> None:
        self.calls.append(("restore", pid))
        self.states[pid] = ProcessState.FAILED if self.fail_restore else ProcessState.LOCKED


class FakeProbe:
    def __init__(self, free: int, footprints: dict[int, int], host: int = 512 * GiB) -> None:
        self.free = free
        self.footprints = footprints
        self.host = host

    def gpu(self, index: int) -> GpuMemory:
        return GpuMemory(free=self.free, total=80 * GiB)

    def footprint(self, index: int, pid: int) -> int:
        return self.footprints.get(pid, 0)

    def host_available(self) -> int:
        return self.host


class FakeEvents:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def write(self, event: str, **fields) -> None:
        self.records.append({"event": event, **fields})


def fake_daemon() -> SimpleNamespace:
    return SimpleNamespace(
        registry=Registry(),
        events=FakeEvents(),
        dirty=False,
        mechanisms=SimpleNamespace(lock_unavailable=None),
    )


def memory_executor(daemon, probe, driver=None) -> MemoryExecutor:
    """Eviction with the fake daemon's registry and events, the fake memory readings and
    driver; a restore marks the daemon dirty."""

    def on_change(event: str) -> None:
        if event == "restore":
            daemon.dirty = True

    mover = MemoryMover(probe, driver, lock_unavailable=daemon.mechanisms.lock_unavailable)
    return MemoryExecutor(daemon.registry, daemon.events, mover, on_change=on_change)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def add_task(daemon, pid: int, name: str, priority: int, **extra) -> Task:
    identity = TaskIdentity(
        task_id=daemon.registry.new_id(),
        pid=pid,
        pgid=None,
        start_time=0,
        uid=os.getuid(),
        name=name,
        priority=priority,
        gpus=extra.pop("gpus", (0,)),
        mechanism="auto",
        **extra,
    )
    task = Task(identity)
    daemon.registry.add(task)
    return task


def test_evict_then_restore(sleeper) -> None:
    daemon, driver = fake_daemon(), FakeDriver()
    probe = FakeProbe(free=1 * GiB, footprints={sleeper.pid: 4 * GiB})
    memory = memory_executor(daemon, probe, driver)
    task = add_task(daemon, sleeper.pid, "trainer", -100)
    memory.evict(task, "test")
    assert driver.calls == [("lock", sleeper.pid), ("checkpoint", sleeper.pid)]
    assert task.evicted and task.suspended and task.counters.evicted_bytes == 4 * GiB
    assert daemon.events.records[-1]["event"] == "evict"
    assert daemon.events.records[-1]["bytes"] == 4 * GiB
    # No room yet: the restore waits instead of risking an out-of-memory restore.
    assert memory.restore(task, "test") is False
    assert task.evicted and task.task_id in memory.pending_restore
    probe.free = 10 * GiB
    assert memory.restore(task, "test") is True
    assert not task.evicted and task.suspended_with == "lock" and daemon.dirty
    assert driver.calls[-1] == ("restore", sleeper.pid)


def test_refuses_twice_and_restore_of_resident(sleeper) -> None:
    daemon, driver = fake_daemon(), FakeDriver()
    memory = memory_executor(daemon, FakeProbe(GiB, {sleeper.pid: GiB}), driver)
    task = add_task(daemon, sleeper.pid, "t", 0)
    with pytest.raises(UsageError, match="not evicted"):
        memory.restore(task, "test")
    memory.evict(task, "test")
    with pytest.raises(UsageError, match="already evicted"):
        memory.evict(task, "test")


def test_refuses_multi_gpu(sleeper) -> None:
    daemon = fake_daemon()
    memory = memory_executor(daemon, FakeProbe(GiB, {}), FakeDriver())
    task = add_task(daemon, sleeper.pid, "ddp", 0, gpus=(0, 1))
    with pytest.raises(MechanismUnavailable, match="multi-GPU"):
        memory.evict(task, "test")


def test_refuses_mps_client(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path))
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        daemon = fake_daemon()
        memory = memory_executor(daemon, FakeProbe(GiB, {}), FakeDriver())
        task = add_task(daemon, proc.pid, "mps", 0)
        with pytest.raises(MechanismUnavailable, match="MPS"):
            memory.evict(task, "test")
    finally:
        proc.kill()
        proc.wait()


def test_refuses_when_host_memory_is_short(sleeper) -> None:
    daemon, driver = fake_daemon(), FakeDriver()
    memory = memory_executor(daemon, FakeProbe(GiB, {sleeper.pid: 8 * GiB}, host=4 * GiB), driver)
    task = add_task(daemon, sleeper.pid, "big", 0)
    with pytest.raises(MechanismFailed, match="host memory"):
        memory.evict(task, "test")
    assert driver.calls == []


def test_failed_state_is_surfaced(sleeper) -> None:
    daemon, driver = fake_daemon(), FakeDriver()
    driver.states[sleeper.pid] = ProcessState.FAILED
    memory = memory_executor(daemon, FakeProbe(GiB, {}), driver)
    task = add_task(daemon, sleeper.pid, "broken", 0)
    with pytest.raises(MechanismFailed, match="FAILED"):
        memory.evict(task, "test")


def test_failed_restore_is_surfaced(sleeper) -> None:
    daemon, driver = fake_daemon(), FakeDriver()
    memory = memory_executor(daemon, FakeProbe(10 * GiB, {sleeper.pid: GiB}), driver)
    task = add_task(daemon, sleeper.pid, "t", 0)
    memory.evict(task, "test")
    driver.fail_restore = True
    with pytest.raises(MechanismFailed, match="FAILED"):
        memory.restore(task, "test")
    assert daemon.events.records[-1]["event"] == "error"


def test_no_driver_is_a_clear_refusal(sleeper) -> None:
    daemon = fake_daemon()
    daemon.mechanisms.lock_unavailable = "libcuda.so.1 could not be loaded"
    memory = memory_executor(daemon, FakeProbe(GiB, {}))
    task = add_task(daemon, sleeper.pid, "t", 0)
    with pytest.raises(MechanismUnavailable, match="checkpoint API"):
        memory.evict(task, "test")


def test_reserve_evicts_lowest_priority_then_largest_and_restores_later() -> None:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        daemon, driver = fake_daemon(), FakeDriver()
        low_small, low_big, normal = (p.pid for p in procs)
        probe = FakeProbe(
            free=2 * GiB, footprints={low_small: 3 * GiB, low_big: 6 * GiB, normal: 10 * GiB}
        )
        memory = memory_executor(daemon, probe, driver)
        add_task(daemon, low_small, "low-small", -100)
        big = add_task(daemon, low_big, "low-big", -100)
        add_task(daemon, normal, "normal", 0)
        server = add_task(daemon, os.getpid(), "server", 100, reserve_bytes=7 * GiB)
        serving = {"now": True}  # what its control block says
        server.controls[1] = SimpleNamespace(is_active=lambda: serving["now"])
        memory.enforce_reserves()
        evicted = [c[1] for c in driver.calls if c[0] == "checkpoint"]
        assert evicted == [low_big]  # 2 + 6 >= 7: the largest low task was enough
        assert big.task_id in memory.auto_evicted
        # Reserve still active: nothing comes back.
        probe.free = 20 * GiB
        memory.enforce_reserves()
        assert big.evicted
        # Reserve released long enough ago: restored.
        serving["now"] = False
        memory.reserve_active_at[0] -= 60
        memory.enforce_reserves()
        assert not big.evicted
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_refuses_nccl_job(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    library = shm / f"nccl-test-{os.getpid()}"
    library.write_bytes(b"\0" * 4096)
    code = (
        "import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(["python3", "-c", code, str(library)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        daemon = fake_daemon()
        memory = memory_executor(daemon, FakeProbe(GiB, {}), FakeDriver())
        task = add_task(daemon, proc.pid, "nccl", 0)
        with pytest.raises(MechanismUnavailable, match="NCCL"):
            memory.evict(task, "test")
    finally:
        proc.kill()
        proc.wait()
        library.unlink()
