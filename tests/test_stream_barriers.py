"""Stream barriers for processes without PyTorch (client/stream_barriers.py), on a fake driver:
when they start and stop, which words each barrier waits for, and what the daemon is told."""

from __future__ import annotations

import time

import pytest

from gpreempt.client import agent
from gpreempt.client.cuda_stream_ops import WAIT_EQ, WAIT_NOR
from gpreempt.client.stream_barriers import StreamBarriers
from gpreempt.control import CLOSED, OFF_AUTO_ACTIVE, OFF_GATE_CLOSED, OFF_REQUESTS, ActivityView
from gpreempt.control_block import ControlBlock


class FakeOps:
    """Records the driver calls; ``devices`` become active when the test says so."""

    def __init__(self) -> None:
        self.devices: list[int] = []
        self.waits: list[tuple[int, int, int, int]] = []  # (device, address, value, how)
        self.current: list[int] = []
        self.fail_wait = False

    def active_devices(self) -> list[int]:
        return list(self.devices)

    def push_context(self, ordinal: int) -> None:
        self.current.append(ordinal)

    def pop_context(self) -> None:
        self.current.pop()

    def device_word(self, address: int, read_only: bool) -> int:
        return address  # the host address stands for the device one

    def wait32(self, device_address: int, value: int, how: int) -> None:
        if self.fail_wait:
            raise RuntimeError("cuStreamWaitValue32 failed (driver error 1)")
        self.waits.append((self.current[-1], device_address, value & 0xFFFFFFFF, how))


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def blocks():
    own, high = ControlBlock.create(), ControlBlock.create()
    view = ActivityView(high.read_only_fd())
    yield own, high, view
    view.close()
    own.close()
    high.close()


def test_no_barriers_before_the_program_has_a_context_or_anyone_outranks_it(blocks):
    own, _, _ = blocks
    ops = FakeOps()
    barriers = StreamBarriers(own, ops, spacing_s=0.001)
    barriers.start()
    try:
        time.sleep(0.1)
        assert not own.barriers_on and not own.gate_installed  # no context yet
        ops.devices = [0]
        _wait_for(lambda: own.barriers_on)
        assert own.gate_installed  # the daemon now closes the gate word instead of locking
        time.sleep(0.1)
        assert ops.waits == []  # nobody more important registered: nothing to hold for
        own.set_window_share(0.5)  # the daemon: a more important task is on this GPU
        _wait_for(lambda: barriers.barriers_put >= 3)
    finally:
        barriers.stop()
    assert not barriers._thread.is_alive()


def test_a_barrier_waits_for_the_own_gate_and_the_watched_activity(blocks):
    own, high, view = blocks
    ops = FakeOps()
    ops.devices = [0, 1]
    barriers = StreamBarriers(own, ops)
    barriers._devices = [0, 1]

    barriers.put()  # no watch list yet: the own word must be plainly open
    own_word = own.address + OFF_GATE_CLOSED
    assert ops.waits == [(0, own_word, 0, WAIT_EQ), (1, own_word, 0, WAIT_EQ)]

    ops.waits.clear()
    barriers.watch([view.address], 3)
    barriers.put()
    first = [w for w in ops.waits if w[0] == 0]
    assert first == [
        (0, own_word, ~CLOSED & 0xFFFFFFFF, WAIT_NOR),  # bit 0: closed for good
        (0, view.address + OFF_REQUESTS, 0, WAIT_EQ),
        (0, view.address + OFF_AUTO_ACTIVE, 0, WAIT_EQ),  # not hinted: auto activity counts
    ]
    assert ops.current == []  # every pushed context was popped

    ops.waits.clear()
    high.set_requests(1)  # the watched task uses request(): its automatic activity no longer
    high.set_requests(0)
    barriers.put()
    assert [w[1] for w in ops.waits if w[0] == 0] == [own_word, view.address + OFF_REQUESTS]


def test_a_closed_gate_gets_barriers_even_with_nobody_registered_above(blocks):
    own, _, _ = blocks
    barriers = StreamBarriers(own, FakeOps())
    assert not barriers.due()
    own.set_gate(True)  # held by hand: what it launches next must wait on the GPU
    assert barriers.due()
    own.set_gate(False)
    own.set_window_share(1.0)
    assert barriers.due()


def test_a_failed_driver_call_turns_barriers_off_and_says_so(blocks, capsys):
    own, _, _ = blocks
    ops = FakeOps()
    ops.devices = [0]
    ops.fail_wait = True
    own.set_window_share(0.5)
    barriers = StreamBarriers(own, ops, spacing_s=0.001)
    barriers.start()
    _wait_for(lambda: barriers.error is not None)
    barriers.stop()
    assert not own.barriers_on and not own.gate_installed  # the daemon goes back to the lock
    assert "stream barriers stopped: cuStreamWaitValue32 failed" in capsys.readouterr().err


class _Session:
    def __init__(self, mechanism: str, priority: int) -> None:
        self.gate = None
        self.barriers = None
        self.mechanism = mechanism
        self.priority = priority
        self.control = object()
        self.driver_gate = False  # no driver-level gate loaded here

    def use_barriers(self, barriers) -> None:  # noqa: ANN001
        self.barriers = barriers


@pytest.mark.parametrize(
    ("mechanism", "priority", "gate_env", "started"),
    [
        ("auto", -100, None, True),  # the default: a trainer gets them
        ("gate", -100, None, True),
        ("lock", -100, None, False),  # a forced mechanism that does not close gates
        ("auto", 100, None, False),  # nothing preempts a high-priority task
        ("auto", -100, "0", False),  # GPREEMPT_GATE=0
    ],
)
def test_which_processes_get_barriers(monkeypatch, mechanism, priority, gate_env, started):
    from gpreempt.client import stream_barriers

    monkeypatch.setattr(stream_barriers.StreamBarriers, "start_for", staticmethod(lambda c: "b"))
    if gate_env is None:
        monkeypatch.delenv(agent.ENV_GATE, raising=False)
    else:
        monkeypatch.setenv(agent.ENV_GATE, gate_env)
    current = _Session(mechanism, priority)
    assert agent.start_barriers_for(current) == ("b" if started else None)
    assert current.barriers == ("b" if started else None)


def test_the_import_hook_acts_once_the_module_is_imported(monkeypatch, tmp_path):
    (tmp_path / "fakegpu.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = agent._ImportHook({"fakegpu": lambda module: seen.append(module.VALUE)})
    monkeypatch.setattr("sys.meta_path", [hook, *__import__("sys").meta_path])
    import fakegpu  # noqa: F401

    assert seen == [7]
    assert hook not in __import__("sys").meta_path  # nothing left to wait for


def test_barriers_that_cannot_start_say_so(monkeypatch, capsys) -> None:
    # no NVIDIA driver with stream memory operations (CuPy on ROCm): never silent
    from gpreempt.client import stream_barriers

    monkeypatch.setattr(stream_barriers.CudaStreamOps, "load", classmethod(lambda cls: None))
    own = ControlBlock.create()
    try:
        assert StreamBarriers.start_for(own) is None
        assert "stream barriers not started" in capsys.readouterr().err
    finally:
        own.close()
