"""Tell the gates what a :class:`~gpreempt.daemon.plan.Plan` says: their in-flight shares and
sleep permissions, their watch lists, the word of every closed gate, and which tasks' raises
may reach the daemon a tick late.

The executor's gate side: everything here writes tasks' control blocks or sends to their
connections, and records what each gate was last told (the task's ``window_share_ms`` and
``sleep_ok``, the connection's watch list); what to tell them was decided by plan.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Protocol

from ..control import CLOSED, closed_while_watched
from ..control_block import ControlBlock
from ..errors import ProtocolError
from ..protocol import MAX_REPLY, encode
from .peer import Peer
from .plan import Plan, WatchList
from .registry import Registry


class Host(Protocol):
    """What the gate executor uses of the daemon: its tasks and connections."""

    registry: Registry
    peers: dict[int, Peer]
    log: Callable[[str], None]

    def send(self, peer: Peer, data: bytes, fds: list[int] | None = None) -> None: ...


class GateExecutor:
    """Writes plans into the gates (one thread: the daemon's loop)."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def apply_gates(self, plan: Plan) -> None:
        """Tell the gates their in-flight shares and sleep permissions, send the watch lists
        that changed, and set the word of every closed gate: closed only while its watched
        tasks are active where the plan allows it, else closed plainly."""
        tasks = self.host.registry.tasks
        for task_id, share in plan.window_shares:
            task = tasks[task_id]
            task.window_share_ms = share
            for control in task.controls.values():
                control.set_window_share(share)
        for task_id, ok in plan.sleep:
            task = tasks[task_id]
            task.sleep_ok = ok
            for control in task.controls.values():
                control.set_sleep_ok(ok)
        for task_id, quiet in plan.quiet:
            task = tasks[task_id]
            task.quiet = quiet
            for control in task.controls.values():
                control.set_quiet(quiet)
        self.send_watches(plan.watches or ())
        for task in tasks.values():
            for conn, control in task.controls.items():
                word = control.gate_word
                if word == 0:
                    continue  # open, or not this mechanism's to close
                version = plan.releases.get((task.task_id, conn), 0) if task.suspended else 0
                if version:
                    if word != closed_while_watched(version):
                        control.close_while_watched(version)
                elif word != CLOSED:
                    control.set_gate(True)

    def send_watches(self, watches: tuple[WatchList, ...]) -> None:
        """Push each connection its new watch list (read-only descriptors of the blocks)."""
        tasks = self.host.registry.tasks
        for watch in watches:
            peer = self.host.peers.get(watch.conn_id)
            if peer is None:
                continue
            peer.watch_version = watch.version
            blocks = [(t, c, tasks[t].controls[c]) for t, c in watch.blocks]
            self._send_watch(peer, blocks)
            peer.watching = watch.blocks

    def _send_watch(self, peer: Peer, blocks: list[tuple[int, int, ControlBlock]]) -> None:
        """Push ``peer`` its watch list with read-only descriptors of the blocks, through its
        outbox (the descriptors go with the message, whenever the client reads it)."""
        fds: list[int] = []
        try:
            fds = [control.read_only_fd() for _t, _c, control in blocks]
            owners = [self.host.peers.get(conn) for _t, conn, _b in blocks]
            message = {
                "push": "watch",
                "tasks": [task_id for task_id, _c, _b in blocks],
                # whose blocks: a gate left with barriers on them when this daemon is gone
                # clears those of owners that exit (client/stranded.py)
                "pids": [owner.pid if owner is not None else None for owner in owners],
                "version": peer.watch_version,
            }
            data = encode({**message, "nfds": len(fds)} if fds else message, MAX_REPLY)
        except (OSError, ProtocolError) as exc:
            self.host.log(f"cannot send the watch list to process {peer.pid}: {exc}")
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            return
        self.host.send(peer, data, fds)
