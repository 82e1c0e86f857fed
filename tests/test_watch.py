"""Which tasks a gate watches directly: a pure function of the snapshot."""

from __future__ import annotations

from gpreempt.policy.hpf import decide_hpf
from gpreempt.policy.snapshot import Snapshot, TaskView
from gpreempt.policy.watch import watch_lists


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
    import os

    from gpreempt.control import ControlBlock
    from gpreempt.daemon.registry import Task
    from gpreempt.daemon.server import Daemon, Peer

    class Recorder:  # stands in for a peer's connection
        def __init__(self) -> None:
            self.sent: list[tuple[dict, int]] = []

        def send(self, message: dict, fds=()) -> None:
            self.sent.append((message, len(fds)))

    daemon = Daemon(tmp_path)
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
                Task(task_id, 100 + task_id, None, 0, uid, f"t{task_id}", priority, (0,), "gate")
            )
            daemon.registry.tasks[task_id].controls[task_id] = block
            peer = Peer(task_id, Recorder(), 100 + task_id, uid, channel_task=task_id)  # type: ignore[arg-type]
            peer.channel_ready = True
            daemon.peers[task_id] = peer
        fds_before = len(os.listdir("/proc/self/fd"))
        daemon._update_watches()
        assert len(os.listdir("/proc/self/fd")) == fds_before  # the sent descriptors are closed
        sent = {task_id: peer.connection.sent for task_id, peer in daemon.peers.items()}
        assert sent[1] == []  # nobody outranks the top task
        assert sent[2] == []  # task 1 outranks it, but belongs to another user
        assert sent[3] == [({"push": "watch", "tasks": [1]}, 1)]  # not task 2: another user
        assert sent[4] == [({"push": "watch", "tasks": [2]}, 1)]
        assert daemon._watched_by(daemon.registry.tasks[3]) == [1]
        daemon._update_watches()  # nothing changed: nothing sent
        assert len(sent[3]) == 1
        daemon.registry.tasks[1].held = True  # a held task preempts no one under hpf
        daemon._update_watches()
        assert sent[3][-1] == ({"push": "watch", "tasks": []}, 0)
    finally:
        for block in blocks:
            block.close()
