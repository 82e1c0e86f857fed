"""Turns among peers: gated tasks of equal priority under a more important task launch one at
a time.

Under strict priority, tasks of equal priority never suspend each other, so three gated
trainers that share a GPU with an inference server run side by side, each with a third of the
GPU's in-flight budget. The GPU runs one process's context at a time and switches whenever a
small queue runs dry: three such trainers make fewer steps together than one alone, and a
request that arrives waits for three queues and the switches between them.

With turns, one task of each such group launches at a time, with the group's whole share of
the budget, while the others wait behind their closed gates. A turn lasts ``turn_ms``, or ends
early once its holder has gone idle. After a busy holder, the group pauses for the holder's
share before the next one starts, so that the first queue has drained before the second fills:
the GPU never holds more than the budget of a group. A holder whose gate puts stream barriers
needs no pause: the GPU stops its queue at the next barrier whatever it holds.

Measured on an H200 with three trainers under an inference server at half load, turns
shortened the server's wait behind them (first kernel after a 1 ms hint: 0.10-0.19 against
0.58 ms at P99) and kept the trainers at least as much throughput as side by side (0.44
against 0.40 in one run; docs/results.md). ``gpreempt serve --turn-ms 0`` turns them off.

Only tasks on one GPU whose gate bounds their queue take turns, and only with tasks of their own
user; a task on several GPUs, or one without a gate, runs as plain hpf says. A peer waits for a
member's turn on that member's word (its gate words say it waits for the others' turns in
turn): another user need not take it, so each user's peers take turns among themselves, and
the daemon takes a member out of its group once one of its waits was found not to hold
(daemon/hold_check.py). While a more important task is active the whole group
is suspended anyway; turns then only pass on when they run out, without a pause.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .snapshot import Snapshot, TaskView

#: Default length of a turn (ms): long against the pause and the context switch between turns,
#: short against a training step, so peers advance together.
DEFAULT_TURN_MS = 20.0
#: A holder seen idle this long into its turn (s) gives the turn on at once (the gates report
#: idleness a grace period after their last GPU work completes).
IDLE_PASS_S = 0.005

GroupKey = tuple[int, int, int]  # (gpu, priority, uid)


@dataclass(frozen=True)
class TurnSettings:
    """How peers take turns: the turn length and the GPU's in-flight budget (both ms)."""

    turn_ms: float = DEFAULT_TURN_MS
    budget_ms: float = 1.0


@dataclass(frozen=True)
class PeerTurn:
    """Whose turn it is in one group: its holder may launch from ``starts`` to ``until``.

    ``task_id`` None: the group is parked (a whole round found every task idle); nobody waits,
    and the first task seen active takes the next turn.
    """

    task_id: int | None
    starts: float
    until: float
    #: The last holder (the rotation goes on after it).
    last: int
    #: Turns in a row that went on because their holder was idle.
    idle_passes: int = 0
    #: Since when the holder may launch: its turn's start, or the end of the last preemption
    #: (None while a more important task is active). Idleness counts only from here: a holder
    #: that a request stopped looks idle without being so.
    open_since: float | None = None


def turn_groups(snapshot: Snapshot) -> dict[GroupKey, list[TaskView]]:
    """(gpu, priority, uid) -> the tasks that take turns there, by task id: gated, on that
    GPU only, not held, below the most important task on the GPU, of that user, and at least
    two of them."""
    groups: dict[GroupKey, list[TaskView]] = {}
    for gpu, tasks in snapshot.by_gpu().items():
        top = max(t.priority for t in tasks)
        for task in tasks:
            if task.priority < top and task.gated and not task.held and len(task.gpus) == 1:
                groups.setdefault((gpu, task.priority, task.uid), []).append(task)
    return {
        key: sorted(peers, key=lambda t: t.task_id)
        for key, peers in groups.items()
        if len(peers) >= 2
    }


def launch_slots(
    snapshot: Snapshot, groups: dict[GroupKey, list[TaskView]] | None = None
) -> dict[int, int]:
    """GPU -> how many of its less important tasks may launch at the same time: each one that
    is not held, each of the turn ``groups`` (from :func:`turn_groups`) counting once."""
    grouped = {t.task_id for peers in (groups or {}).values() for t in peers}
    slots: dict[int, int] = {}
    for gpu, tasks in snapshot.by_gpu().items():
        top = max(t.priority for t in tasks)
        lower = [t for t in tasks if t.priority < top and not t.held]
        kinds = {(t.priority, t.uid) for t in lower if t.task_id in grouped}
        slots[gpu] = len([t for t in lower if t.task_id not in grouped]) + len(kinds)
    return slots


def _after(ids: list[int], task_id: int) -> int:
    """The id that follows ``task_id`` in the cyclic order of ``ids`` (sorted)."""
    later = [i for i in ids if i > task_id]
    return later[0] if later else ids[0]


def take_turns(
    snapshot: Snapshot,
    memory: object,
    settings: TurnSettings,
) -> tuple[frozenset[int], float | None, dict[GroupKey, PeerTurn]]:
    """The tasks that wait for their turn now, when to look again, and the turns to remember
    (``memory`` is what the previous call returned)."""
    previous: dict[GroupKey, PeerTurn] = memory if isinstance(memory, dict) else {}
    groups = turn_groups(snapshot)
    slots = launch_slots(snapshot, groups)
    by_gpu = snapshot.by_gpu()
    waiting: set[int] = set()
    wakes: list[float] = []
    turns: dict[GroupKey, PeerTurn] = {}
    for key, peers in sorted(groups.items()):
        gpu, priority, _uid = key
        preempted = any(t.active and not t.held and t.priority > priority for t in by_gpu[gpu])
        pause_s = settings.budget_ms / 1000 / max(1, slots[gpu])
        turn = _next(peers, previous.get(key), snapshot.now, preempted, settings, pause_s)
        turns[key] = turn
        if turn.task_id is None:
            continue  # parked: everyone may launch; the first launch rings the daemon
        waiting.update(t.task_id for t in peers if t.task_id != turn.task_id)
        if snapshot.now < turn.starts:
            waiting.add(turn.task_id)
            wakes.append(turn.starts)
        holder = next(t for t in peers if t.task_id == turn.task_id)
        if not holder.active and turn.open_since is not None:
            idle_check = turn.open_since + IDLE_PASS_S
            if idle_check > snapshot.now:
                wakes.append(idle_check)
        wakes.append(turn.until)
    return frozenset(waiting), min(wakes) if wakes else None, turns


def _next(
    peers: list[TaskView],
    turn: PeerTurn | None,
    now: float,
    preempted: bool,
    settings: TurnSettings,
    pause_s: float,
) -> PeerTurn:
    """The group's turn after ``turn``, at ``now``."""
    ids = [t.task_id for t in peers]
    turn_s = settings.turn_ms / 1000

    def start(task_id: int, pause: float = 0.0, idle_passes: int = 0) -> PeerTurn:
        starts = now + pause
        open_since = None if preempted else starts
        return PeerTurn(task_id, starts, starts + turn_s, task_id, idle_passes, open_since)

    if turn is None:
        return start(ids[0])
    if turn.task_id is None:  # parked
        active = [t.task_id for t in peers if t.active]
        if not active or preempted:
            return turn
        later = [i for i in active if i > turn.last]
        return start(later[0] if later else active[0])
    if turn.task_id not in ids:  # the holder left the group
        return start(_after(ids, turn.task_id))
    holder = next(t for t in peers if t.task_id == turn.task_id)
    let_run = turn.open_since is not None and now >= turn.open_since + IDLE_PASS_S
    if not holder.active and not preempted and let_run:
        if turn.idle_passes + 1 >= len(ids):
            return PeerTurn(None, now, float("inf"), turn.task_id)
        return start(_after(ids, turn.task_id), idle_passes=turn.idle_passes + 1)
    if now >= turn.until:
        # a busy holder's queue drains before the next one fills its own, unless the more
        # important task stopped it already or the holder's stream barriers hold its queue
        # (a request then waits for one barrier's spacing of it, drained or not)
        pause = pause_s if holder.active and not preempted and not holder.barriers else 0.0
        return start(_after(ids, turn.task_id), pause)
    # the holder keeps its turn
    if preempted:
        open_since = None
    else:
        open_since = turn.open_since if turn.open_since is not None else max(now, turn.starts)
    idle_passes = 0 if holder.active else turn.idle_passes
    return replace(turn, open_since=open_since, idle_passes=idle_passes)
