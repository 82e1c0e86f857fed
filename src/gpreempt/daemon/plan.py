"""What one scheduling pass does, as a pure function: ``plan(snapshot, decision, ...) -> Plan``.

The policy (gpreempt.policy) says which tasks should be suspended. Turning that answer into
actions needs a little more of what the daemon knows: which tasks are suspended already, held
by hand or evicted, which control blocks and connections each has, which watch list each gate
was last sent. :func:`plan` reads those as frozen facts (:class:`TaskFacts`,
:class:`PeerFacts`) and returns a frozen :class:`Plan`: whom to suspend and resume, the
in-flight share and sleep permission each gate is told, the watch lists to send, and which
closed gates may go on by themselves once their watched tasks are idle, what to suspend with
where a task's own mechanism fails. No I/O, no clock:
``daemon/apply.py`` carries a plan out, and the tests check plans as values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..names import MechanismName
from ..policy import Decision, Snapshot
from ..policy.inflight import inflight_shares
from ..policy.sleep import sleepers
from ..policy.watch import waited_for, watch_lists
from ..protocol import MAX_FDS

#: Watch list versions run from 1 to this, then start again (gate_closed holds twice one).
MAX_WATCH_VERSION = 2**31 - 1

#: One watched control block: (id of the task it belongs to, id of the connection it came on).
WatchedBlock = tuple[int, int]


@dataclass(frozen=True)
class TaskFacts:
    """What the daemon knows of one task beyond the policy's view of it."""

    task_id: int
    priority: int
    uid: int
    #: Suspended now (by whatever mechanism).
    suspended: bool
    #: Held by hand (``gpreempt suspend``): kept suspended whatever the policy says.
    held: bool
    #: Suspended only until its turn among gated peers (state ``waiting_turn``).
    waiting_turn: bool
    #: Its memory is on the host: it stays suspended until restored.
    evicted: bool
    #: The policy's last suspension of it failed (state ``unprotected``).
    unprotected: bool
    #: Its mechanism may close its in-process gate (the daemon then manages the gate word).
    closes_gate: bool
    #: Its mechanism is backed up by signals where it fails to suspend (mechanism ``auto``).
    backed_up: bool
    #: Always active: no control block tells when it is, so no gate can watch it.
    always_active: bool
    #: Ids of the connections whose control blocks it has, in order.
    controls: tuple[int, ...]
    #: In-flight share (ms) its gates were last told (None: no limit from the daemon).
    window_share_ms: float | None
    #: Whether its gates were last told they may sleep.
    sleep_ok: bool
    #: Its gate holds what it queued by itself while a watched task is active (driver-level
    #: gate, or stream barriers), and no check found it leaking.
    holds_itself: bool = False
    #: Whether its blocks were last told that nobody needs its doorbell rung at once.
    quiet: bool = False


@dataclass(frozen=True)
class PeerFacts:
    """One connection as far as watch lists go."""

    conn_id: int
    #: The task its control block feeds (None: it has no channel).
    channel_task: int | None
    #: The channel's reply went out: pushes may follow.
    channel_ready: bool
    #: The blocks its gate watches now, and the version of that list (0: none sent yet).
    watching: tuple[WatchedBlock, ...]
    watch_version: int


@dataclass(frozen=True)
class PlanSettings:
    """The daemon's settings that shape a plan (``gpreempt serve`` options)."""

    #: GPU time (ms) the preemptible tasks of one GPU keep in flight together (0: no budget).
    inflight_budget_ms: float
    #: Gated peers take turns (policy/turns.py): they share one part of the budget.
    turns: bool
    #: Gates sleep once every more important task was idle this long (0: never).
    sleep_after_s: float
    #: Gates watch the activity of the tasks that outrank them (policy/watch.py).
    watch: bool
    #: A gate closed only for watched tasks goes on by itself once they are idle.
    watch_resume: bool


@dataclass(frozen=True)
class Suspension:
    """One task to suspend; ``turn``: only to wait for its turn among peers."""

    task_id: int
    turn: bool
    #: What suspends it where its own mechanism fails (None: nothing, it is unprotected).
    fallback: MechanismName | None = None


@dataclass(frozen=True)
class WaitFor:
    """A suspended task that now waits for something else: its turn among peers (``turn``),
    or a more important task (or its hold)."""

    task_id: int
    turn: bool


@dataclass(frozen=True)
class WatchList:
    """A watch list to send to one connection's gate, with its new version."""

    conn_id: int
    version: int
    blocks: tuple[WatchedBlock, ...]


@dataclass(frozen=True)
class Plan:
    """What one scheduling pass does, in the order it is done."""

    #: Tasks to suspend, least important first (a more important task waits for them).
    suspend: tuple[Suspension, ...]
    #: Suspended tasks (evicted ones aside) whose reason to wait changed.
    wait_changes: tuple[WaitFor, ...]
    #: Tasks to resume: suspended, wanted by neither the policy nor a hold, not evicted.
    resume: tuple[int, ...]
    #: Tasks no longer unprotected: the policy does not want them suspended any more.
    protected_again: tuple[int, ...]
    #: (task id, share) for each task whose gates must be told a new in-flight share.
    window_shares: tuple[tuple[int, float | None], ...]
    #: (task id, may sleep) for each task whose gates must be told a new permission.
    sleep: tuple[tuple[int, bool], ...]
    #: Watch lists to send (changed ones only); None: not computed in this pass.
    watches: tuple[WatchList, ...] | None
    #: (task id, connection id) -> watch list version, for each gate that, while its task is
    #: suspended, may go on by itself once the tasks of that list are idle; every other
    #: closed gate is closed plainly.
    releases: Mapping[WatchedBlock, int]
    #: When to plan again even if nothing changes (the policy's or a gate's next sleep).
    wake_at: float | None
    #: (task id, quiet) for each task whose blocks must be told anew whether every task it
    #: outranks holds itself on its words (:func:`quiet_tasks`).
    quiet: tuple[tuple[int, bool], ...] = ()


def plan(
    snapshot: Snapshot,
    decision: Decision,
    tasks: Sequence[TaskFacts],
    peers: Sequence[PeerFacts],
    settings: PlanSettings,
    *,
    watches: bool = True,
) -> Plan:
    """The actions that make the daemon's state match ``decision`` for ``snapshot``.

    ``tasks`` are the daemon's facts on the same tasks as the snapshot; ``watches``: whether
    to work out the watch lists (the daemon skips it while nothing they depend on changed).
    """
    held = {t.task_id for t in tasks if t.held}
    wanted = set(decision.suspend) | held
    turns = frozenset(decision.turns) - held
    suspend = tuple(
        Suspension(t.task_id, t.task_id in turns, MechanismName.SIGNAL if t.backed_up else None)
        for t in sorted(tasks, key=lambda t: t.priority)
        if t.task_id in wanted and not t.suspended
    )
    wait_changes = tuple(
        WaitFor(t.task_id, t.task_id in turns)
        for t in sorted(tasks, key=lambda t: t.priority)
        if t.suspended and not t.evicted and t.waiting_turn != (t.task_id in turns)
    )
    resume = tuple(
        t.task_id for t in tasks if t.task_id not in wanted and t.suspended and not t.evicted
    )
    protected_again = tuple(t.task_id for t in tasks if t.task_id not in wanted and t.unprotected)

    budget = inflight_shares(snapshot, settings.inflight_budget_ms, turns=settings.turns)
    shares = tuple(
        (t.task_id, budget.get(t.task_id))
        for t in tasks
        if budget.get(t.task_id) != t.window_share_ms
    )
    allowed, next_sleep = sleepers(snapshot, settings.sleep_after_s)
    sleep = tuple(
        (t.task_id, t.task_id in allowed) for t in tasks if (t.task_id in allowed) != t.sleep_ok
    )

    sent = plan_watches(snapshot, tasks, peers, settings.watch) if watches else None
    watching = {p.conn_id: (p.watching, p.watch_version) for p in peers}
    for watch in sent or ():
        watching[watch.conn_id] = (watch.blocks, watch.version)
    waits = waited_for(snapshot, decision.until_idle) if settings.watch_resume else {}
    releases = gate_releases(tasks, waits, watching)
    calm = quiet_tasks(snapshot, tasks, watching) if settings.watch else frozenset()
    quiet = tuple((t.task_id, t.task_id in calm) for t in tasks if (t.task_id in calm) != t.quiet)

    due = [t for t in (decision.wake_at, next_sleep) if t is not None]
    return Plan(
        suspend=suspend,
        wait_changes=wait_changes,
        resume=resume,
        protected_again=protected_again,
        window_shares=shares,
        sleep=sleep,
        watches=sent,
        releases=releases,
        wake_at=min(due) if due else None,
        quiet=quiet,
    )


def plan_watches(
    snapshot: Snapshot, tasks: Sequence[TaskFacts], peers: Sequence[PeerFacts], enabled: bool
) -> tuple[WatchList, ...]:
    """The watch lists that changed: for each gated connection, the control blocks of the
    tasks that outrank its task, read-only and only between tasks of the same user (at most
    :data:`MAX_FDS`; beyond that the daemon's own closing still applies)."""
    lists = watch_lists(snapshot) if enabled else {}
    by_id = {t.task_id: t for t in tasks}
    sent = []
    for peer in peers:
        low = by_id.get(peer.channel_task if peer.channel_task is not None else -1)
        if not peer.channel_ready or low is None:
            continue
        blocks: list[WatchedBlock] = []
        for high_id in sorted(lists.get(low.task_id, ())):
            high = by_id.get(high_id)
            if high is None or high.uid != low.uid:
                continue  # another user's activity is not this one's to read
            blocks += [(high_id, conn) for conn in sorted(high.controls)]
        key = tuple(blocks[:MAX_FDS])
        if key != peer.watching:
            sent.append(WatchList(peer.conn_id, next_watch_version(peer.watch_version), key))
    return tuple(sent)


def next_watch_version(version: int) -> int:
    """The version after ``version``: from 1 to :data:`MAX_WATCH_VERSION`, never 0."""
    return version % MAX_WATCH_VERSION + 1


def gate_releases(
    tasks: Sequence[TaskFacts],
    waits: Mapping[int, frozenset[int]],
    watching: Mapping[int, tuple[tuple[WatchedBlock, ...], int]],
) -> dict[WatchedBlock, int]:
    """Which gates may go on by themselves (policy/watch.py): those of tasks suspended only
    for more important tasks' activity (``waits``), neither held nor evicted, whose gate
    reads every word that makes each of those tasks active; the value is the version of the
    watch list it reads them through."""
    by_id = {t.task_id: t for t in tasks}
    releases: dict[WatchedBlock, int] = {}
    for task in tasks:
        if task.held or task.evicted or not task.closes_gate:
            continue
        causes = [by_id.get(i) for i in waits.get(task.task_id, ())]
        if not causes:
            continue
        for conn in task.controls:
            blocks, version = watching.get(conn, ((), 0))
            if version and all(_watches_all_of(blocks, high) for high in causes):
                releases[(task.task_id, conn)] = version
    return releases


def quiet_tasks(
    snapshot: Snapshot,
    tasks: Sequence[TaskFacts],
    watching: Mapping[int, tuple[tuple[WatchedBlock, ...], int]],
) -> frozenset[int]:
    """The tasks whose activity nobody needs the daemon to act on at once: every task each
    one outranks on a GPU they share (policy/watch.py) either waits anyway (held, evicted) or
    holds itself the moment it becomes active: its mechanism closes its gate, that gate holds
    its queued work by itself, and every connection of it watches each of the task's blocks
    (so none of another user). Their raises may reach the daemon a tick late."""
    by_id = {t.task_id: t for t in tasks}
    calm = {t.task_id for t in tasks if t.controls and not t.always_active}
    for low_id, highs in watch_lists(snapshot).items():
        low = by_id.get(low_id)
        if low is None or low.held or low.evicted:
            continue
        for high_id in highs & calm:
            high = by_id.get(high_id)
            lists = [watching.get(conn, ((), 0)) for conn in low.controls]
            self_held = (
                high is not None
                and low.uid == high.uid  # watch lists never cross users
                and low.closes_gate
                and low.holds_itself
                and bool(lists)
                and all(version != 0 and _watches_all_of(blocks, high) for blocks, version in lists)
            )
            if not self_held:
                calm.discard(high_id)
    return frozenset(calm)


def _watches_all_of(blocks: Iterable[WatchedBlock], high: TaskFacts | None) -> bool:
    """Whether a gate that reads ``blocks`` reads every word that makes ``high`` active."""
    watched = set(blocks)
    return (
        high is not None
        and not high.always_active
        and bool(high.controls)
        and all((high.task_id, conn) in watched for conn in high.controls)
    )
