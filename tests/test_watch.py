"""Which tasks a gate watches directly (a pure function of the snapshot), and a gate closed
only while those tasks are active going on by itself when they end."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import pytest
from conftest import TORCH_COUNTER, Counter, Daemon, spawn, status, stop_all, wait_for

from gpreempt.control import CLOSED, closed_while_watched, released_by_watch
from gpreempt.control_block import ControlBlock
from gpreempt.daemon.server import MAX_WATCH_VERSION, Peer, watched_blocks
from gpreempt.daemon.server import Daemon as DaemonServer
from gpreempt.daemon.task import Task
from gpreempt.daemon.task_identity import TaskIdentity
from gpreempt.daemon.task_state import TaskState, change_state
from gpreempt.policy.hpf import decide_hpf
from gpreempt.policy.snapshot import Snapshot, TaskView
from gpreempt.policy.turns import TurnSettings
from gpreempt.policy.watch import waited_for, watch_lists


def _task(task_id: int, priority: int, gpus=(0,), held=False, active=False) -> TaskView:
    return TaskView(task_id=task_id, priority=priority, gpus=gpus, active=active, held=held)


def test_each_task_watches_the_more_important_tasks_of_its_gpus() -> None:
    snapshot = Snapshot(
        now=0.0,
        tasks=(
            _task(1, 100),
            _task(2, 0),
            _task(3, -100),
            _task(4, -100),  # equal priorities never stop each other
            _task(5, 50, gpus=(1,)),  # another GPU
            _task(6, -100, gpus=(0, 1)),  # both GPUs: the union
        ),
    )
    assert watch_lists(snapshot) == {
        2: frozenset({1}),
        3: frozenset({1, 2}),
        4: frozenset({1, 2}),
        6: frozenset({1, 2, 5}),
    }


def test_held_tasks_are_not_watched_and_nothing_outranks_the_top() -> None:
    snapshot = Snapshot(now=0.0, tasks=(_task(1, 100, held=True), _task(2, 0), _task(3, -5)))
    assert watch_lists(snapshot) == {3: frozenset({2})}
    assert watch_lists(Snapshot(now=0.0, tasks=(_task(1, 0),))) == {}


def test_a_watched_task_becoming_active_is_exactly_when_hpf_suspends() -> None:
    """The watch never stops a task that hpf would leave running."""
    tasks = [_task(1, 100), _task(2, 0), _task(3, -100), _task(4, 10, gpus=(1,)), _task(5, 0)]
    for active in range(1, 6):
        views = tuple(
            TaskView(t.task_id, t.priority, t.gpus, active=t.task_id == active) for t in tasks
        )
        snapshot = Snapshot(now=0.0, tasks=views)
        stopped_by_watch = {
            low for low, higher in watch_lists(snapshot).items() if active in higher
        }
        assert stopped_by_watch == set(decide_hpf(snapshot).suspend)


def test_the_daemon_shows_a_task_only_its_own_users_more_important_tasks(tmp_path) -> None:
    """The views are read-only, but a descriptor can be reopened through /proc: another
    user's block must never be sent. Also: only the blocks of tasks that outrank the receiver,
    and again only when that set changes."""

    class Recorder:  # stands in for a peer's connection and its outbox
        fds = 0
        fds_held = 0

        def __init__(self) -> None:
            self.sent: list[tuple[dict, int]] = []

        def put(self, data: bytes, fds=()) -> bool:
            message = json.loads(data)
            message.pop("nfds", None)
            self.sent.append((message, len(fds)))
            for fd in fds:
                os.close(fd)
            return True

        def flush(self) -> bool:
            return True

    daemon = DaemonServer(tmp_path)
    blocks = [ControlBlock.create() for _ in range(4)]
    try:
        specs = [  # task id, uid, priority
            (1, 1000, 100),  # the user's server
            (2, 2000, 50),  # another user's server, between the two
            (3, 1000, -100),  # the user's trainer
            (4, 2000, -100),  # the other user's trainer
        ]
        for (task_id, uid, priority), block in zip(specs, blocks, strict=True):
            daemon.registry.add(
                Task(
                    TaskIdentity(
                        task_id, 100 + task_id, None, 0, uid, f"t{task_id}", priority, (0,), "gate"
                    )
                )
            )
            daemon.registry.tasks[task_id].controls[task_id] = block
            recorder = Recorder()
            peer = Peer(task_id, recorder, 100 + task_id, uid, channel_task=task_id)  # type: ignore[arg-type]
            peer.outbox = recorder  # type: ignore[assignment]
            peer.channel_ready = True
            daemon.peers[task_id] = peer
        fds_before = len(os.listdir("/proc/self/fd"))
        daemon.reconciler.update_watches()
        assert len(os.listdir("/proc/self/fd")) == fds_before  # the sent descriptors are closed
        sent = {task_id: peer.connection.sent for task_id, peer in daemon.peers.items()}
        assert sent[1] == []  # nobody outranks the top task
        assert sent[2] == []  # task 1 outranks it, but belongs to another user
        # not task 2
        assert sent[3] == [({"push": "watch", "tasks": [1], "pids": [101], "version": 1}, 1)]
        assert sent[4] == [({"push": "watch", "tasks": [2], "pids": [102], "version": 1}, 1)]
        assert daemon.handlers.watched_by_task()[3] == [1]
        # what the backstop reads of it: the blocks (task, connection) a connection watches
        assert (
            watched_blocks(daemon.peers, 3) == ((1, 1),) and watched_blocks(daemon.peers, 9) == ()
        )
        daemon.reconciler.update_watches()  # nothing changed: nothing sent
        assert len(sent[3]) == 1
        daemon.registry.tasks[1].held = True  # a held task preempts no one under hpf
        daemon.reconciler.update_watches()
        assert sent[3][-1] == ({"push": "watch", "tasks": [], "pids": [], "version": 2}, 0)
        daemon.peers[3].watch_version = MAX_WATCH_VERSION  # versions wrap, never reach 0
        daemon.registry.tasks[1].held = False
        daemon.reconciler.update_watches()
        assert sent[3][-1] == ({"push": "watch", "tasks": [1], "pids": [101], "version": 1}, 1)
    finally:
        for block in blocks:
            block.close()


def test_the_gate_word_rule_for_closing_only_while_watched_tasks_are_active() -> None:

    word = closed_while_watched(3)
    assert word == 6 and word % 2 == 0  # even: a stream barrier waits for bit 0
    assert released_by_watch(word, 3, watched_active=False)
    assert not released_by_watch(word, 3, watched_active=True)  # they are still active
    assert not released_by_watch(word, 2, watched_active=False)  # an older list
    assert not released_by_watch(word, 0, watched_active=False)  # none, or cut short
    assert not released_by_watch(CLOSED, 0, watched_active=False)  # plainly closed
    assert not released_by_watch(0, 0, watched_active=False)  # open: nothing to release
    with pytest.raises(ValueError, match="run from 1"):
        closed_while_watched(0)


def test_hpf_says_who_waits_only_for_active_tasks_and_for_which() -> None:

    snapshot = Snapshot(
        now=0.0,
        tasks=(
            _task(1, 100, active=True),
            _task(2, 50),  # idle: keeps no one waiting
            _task(3, 0, held=True, active=True),  # held: preempts no one
            _task(4, -100),
            _task(5, -100, gpus=(1,)),  # alone on GPU 1
        ),
    )
    decision = decide_hpf(snapshot)
    assert decision.until_idle == decision.suspend == {2, 3, 4}
    assert waited_for(snapshot, decision.until_idle) == {
        2: frozenset({1}),
        3: frozenset({1}),
        4: frozenset({1}),
    }
    # gated peers taking turns: the one whose turn it is waits only for the server, the
    # others also for their turn
    peers = (
        TaskView(1, 100, (0,), active=True),
        TaskView(2, 0, (0,), active=True, gated=True),
        TaskView(3, 0, (0,), active=True, gated=True),
    )
    decision = decide_hpf(Snapshot(now=0.0, tasks=peers), turns=TurnSettings())
    assert decision.suspend == {2, 3}
    assert len(decision.until_idle) == 1


def test_the_daemon_lets_a_gate_go_on_by_itself_only_for_tasks_it_watches(tmp_path) -> None:

    class Recorder:  # stands in for a peer's connection and its outbox
        fds = 0
        fds_held = 0

        def put(self, data: bytes, fds=()) -> bool:
            for fd in fds:
                os.close(fd)
            return True

        def flush(self) -> bool:
            return True

    def build(**options) -> tuple[DaemonServer, list[ControlBlock]]:
        daemon = DaemonServer(tmp_path, **options)
        blocks = [ControlBlock.create() for _ in range(4)]
        specs = [(1, 1000, 100), (2, 2000, 100), (3, 1000, -100), (4, 2000, -100)]
        for (task_id, uid, priority), block in zip(specs, blocks, strict=True):
            task = Task(
                TaskIdentity(
                    task_id, 100 + task_id, None, 0, uid, f"t{task_id}", priority, (0,), "gate"
                )
            )
            task.controls[task_id] = block
            daemon.registry.add(task)
            recorder = Recorder()
            peer = Peer(task_id, recorder, 100 + task_id, uid, channel_task=task_id)  # type: ignore[arg-type]
            peer.outbox = recorder  # type: ignore[assignment]
            peer.channel_ready = True
            daemon.peers[task_id] = peer
        daemon.reconciler.update_watches()
        return daemon, blocks

    def words(daemon: DaemonServer, blocks: list[ControlBlock], active: set[int]) -> list[int]:
        """The gate words after a decision with ``active`` tasks, trainers 3 and 4 closed."""
        tasks = daemon.registry.tasks
        for task in tasks.values():
            task.was_active = task.task_id in active
        for task_id in (3, 4):
            if not tasks[task_id].suspended:
                change_state(tasks[task_id], TaskState.SUSPENDED, now=0.0, mechanism="gate")
            blocks[task_id - 1].set_gate(True)
        snapshot = daemon.registry.snapshot(0.0)
        daemon.gates.apply_gates(daemon.reconciler.plan(snapshot, decide_hpf(snapshot)))
        return [block.gate_word for block in blocks]

    daemon, blocks = build()
    try:
        version = daemon.peers[3].watch_version
        assert version >= 1
        # user 1000's server is active: its trainer watches it and may go on by itself; the
        # other user's trainer does not watch it and waits for the daemon
        assert words(daemon, blocks, {1}) == [0, 0, closed_while_watched(version), CLOSED]
        # both servers active: trainer 3 does not watch the other user's server
        assert words(daemon, blocks, {1, 2}) == [0, 0, CLOSED, CLOSED]
        daemon.registry.tasks[3].held = True  # `gpreempt suspend`: only the daemon reopens it
        assert words(daemon, blocks, {1}) == [0, 0, CLOSED, CLOSED]
        daemon.registry.tasks[3].held = False
        assert words(daemon, blocks, {1})[2] == closed_while_watched(version)
        change_state(daemon.registry.tasks[3], TaskState.EVICTED, now=0.0)
        assert words(daemon, blocks, {1})[2] == CLOSED
    finally:
        for block in blocks:
            block.close()
    daemon, blocks = build(watch_resume=False)
    try:
        assert words(daemon, blocks, {1}) == [0, 0, CLOSED, CLOSED]
    finally:
        for block in blocks:
            block.close()


HIGH_UNTIL_RELEASED = """
import os, sys, time
import gpreempt
marker, release = sys.argv[1], sys.argv[2]
with gpreempt.request():
    open(marker, "w").write("in")
    while not os.path.exists(release):
        time.sleep(0.01)
open(marker, "w").write("out")
time.sleep(60)
"""


@pytest.mark.parametrize("resume", [True, False], ids=["watch-resume", "no-watch-resume"])
def test_a_trainer_goes_on_when_the_request_ends_even_while_the_daemon_is_stopped(
    runtime_dir, tmp_path, resume
) -> None:
    """A gated PyTorch loop stopped for a server's request: with the daemon itself frozen
    (SIGSTOP), the loop resumes the moment the request ends, by its gate's watch alone. With
    ``--no-watch-resume`` it waits for the daemon."""

    pytest.importorskip("torch")
    daemon = Daemon(runtime_dir, *([] if resume else ["--no-watch-resume"]))
    (tmp_path / "low.py").write_text(TORCH_COUNTER)
    (tmp_path / "high.py").write_text(HIGH_UNTIL_RELEASED)
    counter = Counter(tmp_path / "progress")
    marker, release = tmp_path / "marker", tmp_path / "release"
    procs = [
        spawn(
            runtime_dir, "run", "-p", "low", "--mechanism", "gate", "--name", "trainer", "--",
            sys.executable, str(tmp_path / "low.py"), str(counter.path),
        )
    ]  # fmt: skip

    def trainer() -> dict:
        return next((t for t in status(runtime_dir)["tasks"] if t["name"] == "trainer"), {})

    try:
        assert wait_for(lambda: (trainer().get("gate") or {}).get("installed"), 120), trainer()
        procs.append(
            spawn(
                runtime_dir, "run", "-p", "high", "--name", "server", "--",
                sys.executable, str(tmp_path / "high.py"), str(marker), str(release),
            )
        )  # fmt: skip
        assert wait_for(lambda: marker.exists() and marker.read_text() == "in", 20)
        assert wait_for(lambda: trainer().get("state") == "suspended", 10), trainer()
        assert counter.progress_over(0.3) == 0, "the trainer ran inside the request"
        os.kill(daemon.process.pid, signal.SIGSTOP)
        try:
            release.touch()
            assert wait_for(lambda: marker.read_text() == "out", 10)
            before = counter.value()
            went_on = wait_for(lambda: counter.value() > before, 2.0)
        finally:
            os.kill(daemon.process.pid, signal.SIGCONT)
        assert went_on == resume
        before = counter.value()
        assert wait_for(lambda: counter.value() > before, 10), "the daemon did not resume it"
    finally:
        stop_all(*procs, timeout=20)
        daemon.stop()


class _Silent:
    """A daemon connection that never sends anything (the session's reader waits on it)."""

    def __init__(self) -> None:
        self.sock = type("Sock", (), {"settimeout": lambda self, timeout: None})()
        self._never = threading.Event()

    def receive(self):  # noqa: ANN201
        self._never.wait()


class _Client:
    def __init__(self) -> None:
        self.connection = _Silent()


class _RecordingGate:
    def __init__(self, barrier_ms: float) -> None:
        self.config = type("Config", (), {"barrier_ms": barrier_ms})()
        self.calls: list[tuple[list[int], int]] = []

    def watch(self, addresses, version) -> None:  # noqa: ANN001
        self.calls.append((list(addresses), version))


@pytest.mark.parametrize("barrier_ms", [0.0, 0.05])
def test_the_session_hands_the_gate_each_list_with_its_version(monkeypatch, barrier_ms) -> None:
    """A complete list keeps its version, one that could not all be mapped gets 0 (the gate
    then never goes on by itself), and a gate that puts stream barriers keeps every watched
    block it ever read mapped (the GPU may still read it)."""
    from gpreempt.client import session as session_mod

    monkeypatch.setattr(session_mod, "UNMAP_AFTER_S", 0.0)
    own, high = ControlBlock.create(), ControlBlock.create()
    reply = {"task_id": 2, "name": "trainer", "priority": -100, "mechanism": "gate"}
    current = session_mod.Session(_Client(), own, reply)  # type: ignore[arg-type]
    gate = _RecordingGate(barrier_ms)
    try:
        current.use_gate(gate)
        current._set_watched([high.read_only_fd()], 3)
        (view,) = current._watched
        assert gate.calls[-1] == ([view.address], 3)
        own.set_gate(True)
        own.close_while_watched(3)
        assert not current.must_wait()  # closed only while the server is active: it is not
        high.set_requests(1)
        assert current.must_wait()
        high.set_requests(0)
        bad = os.open("/dev/null", os.O_RDONLY)  # cannot be mapped as a control block
        current._set_watched([high.read_only_fd(), bad], 4)
        assert gate.calls[-1] == ([view.address], 0)  # not the list the daemon versioned
        assert current.must_wait()  # so the closed gate waits for the daemon
        current._set_watched([], 5)  # retires the view the first two lists read
        current._set_watched([], 6)  # a moment later: unmapped, unless barriers may read it
        assert (view.address != 0) == (barrier_ms > 0)
    finally:
        own.close()
        high.close()


def test_a_block_watched_again_is_read_where_it_is_mapped(monkeypatch) -> None:
    """Each change of the watch list sends every watched block again: a block already
    mapped, watched until now or retired (a gate with barriers keeps those mapped for good),
    is read at its mapping, so the blocks a long-lived trainer maps stay one per task it
    ever watched, however often the list changes."""
    from gpreempt.client import session as session_mod

    own, first, second = ControlBlock.create(), ControlBlock.create(), ControlBlock.create()
    reply = {"task_id": 2, "name": "trainer", "priority": -100, "mechanism": "gate"}
    current = session_mod.Session(_Client(), own, reply)  # type: ignore[arg-type]
    gate = _RecordingGate(0.05)  # barriers: nothing it read is unmapped
    try:
        current.use_gate(gate)
        current._set_watched([first.read_only_fd()], 1)  # its owner not named
        (view,) = current._watched
        assert current._blocks[0].pidfd is None
        current._set_watched([first.read_only_fd()], 2, [os.getpid()])  # named now
        assert current._blocks[0].pid == os.getpid() and current._blocks[0].pidfd is not None
        for version in range(3, 12):  # a second server comes and goes, ten times
            fds = [first.read_only_fd()] + ([second.read_only_fd()] if version % 2 else [])
            current._set_watched(fds, version)
            assert current._watched[0] is view and gate.calls[-1][0][0] == view.address
        current._set_watched([], 12)
        current._set_watched([second.read_only_fd(), first.read_only_fd()], 13)
        assert current._watched[1] is view  # back from the retired views
        assert len({v.address for v in current._watched}) == 2
        assert len(current._retired) == 0  # both watched again: none retired
        first.set_requests(1)
        assert current.watched_active()
    finally:
        own.close()
        first.close()
        second.close()


class _Scripted(_Silent):
    """A daemon connection that delivers the given messages, then nothing more."""

    def __init__(self, items: list) -> None:
        super().__init__()
        self._items = list(items)
        self.asked = 0  # receive() calls: once it exceeds the items, all were handled

    def receive(self):  # noqa: ANN201
        self.asked += 1
        if self._items:
            return self._items.pop(0)
        return super().receive()


@pytest.mark.parametrize("with_fd", [False, True])
def test_a_watch_push_missing_its_descriptors_is_no_list_the_daemon_versioned(with_fd) -> None:
    """A push whose descriptors did not all arrive must not pass for the daemon's list: the
    gate would take a ``2V`` word as released while it watches nothing."""
    from gpreempt.client import session as session_mod

    own, high = ControlBlock.create(), ControlBlock.create()
    reply = {"task_id": 2, "name": "trainer", "priority": -100, "mechanism": "gate"}
    client = _Client()
    fds = [high.read_only_fd()] if with_fd else []
    client.connection = _Scripted([({"push": "watch", "tasks": [1], "version": 7}, fds)])
    try:
        current = session_mod.Session(client, own, reply)  # type: ignore[arg-type]
        assert wait_for(lambda: client.connection.asked >= 2, 5)
        assert current._watch_version == (7 if with_fd else 0)
        assert len(current._watched) == len(fds)
    finally:
        own.close()
        high.close()
