"""The process-wide client: one channel to the daemon, shared by request(), the gate and yield.

A process gets a session when it runs under ``gpreempt run`` (the launcher puts the task id
and runtime directory in its environment) or calls :func:`gpreempt.attach`. Without one,
``request()`` and ``should_yield()`` cost a dictionary lookup and do nothing, so libraries
can call them unconditionally.

If the daemon goes away, the session opens its own gate at once, so nothing stays blocked, and
hands the same control block to the next daemon that serves the runtime directory.

The daemon may also send the session read-only views of the control blocks of the tasks that
outrank it (see :mod:`gpreempt.policy.watch`); the session hands their addresses to the gate,
which then stops by itself while one of them is active, and goes on by itself once none is if
the daemon closed it only for them (:func:`gpreempt.control.released_by_watch`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..config import ENV_RUNTIME_DIR, ENV_TASK_ID, request_linger_ms, request_warm
from ..control import ActivityView, released_by_watch
from ..control_block import ControlBlock
from ..errors import DaemonUnavailable, GpreemptError, UsageError
from ..protocol import ProtocolError
from .connection import DaemonClient
from .linger import PythonScopes
from .native_scopes import NativeScopes, open_scopes
from .ranks import rank_gpu
from .stranded import WatchedBlock, block_key, free_stranded

if TYPE_CHECKING:
    from .gate import Gate
    from .stream_barriers import StreamBarriers

#: How often a session whose daemon went away looks for a new one.
RECONNECT_PERIOD_S = 1.0
#: How long a watched block stays mapped after the gate stopped reading it (a gate thread may
#: be between loading the old list and reading from it).
UNMAP_AFTER_S = 5.0


class Session:
    """A live channel: the control block shared with the daemon and the request count."""

    def __init__(
        self,
        client: DaemonClient,
        control: ControlBlock,
        reply: dict[str, Any],
        register: dict[str, Any] | None = None,
        linger_ms: float | None = None,
        warm: bool | None = None,
    ) -> None:
        self.client = client
        self.control = control
        self._register = register
        self.task_id: int = reply["task_id"]
        self.name: str = reply["name"]
        self.priority: int = reply["priority"]
        self.mechanism: str = reply["mechanism"]
        self.connected = True
        self.gate: Gate | None = None  # the launch gate, once installed (:meth:`use_gate`)
        #: Stream barriers without a gate (:meth:`use_barriers`), for programs not on PyTorch.
        self.barriers: StreamBarriers | None = None
        #: Whether the driver-level gate took this session's block (:meth:`use_driver_gate`).
        self.driver_gate = False
        linger_s = (request_linger_ms() if linger_ms is None else linger_ms) / 1e3
        #: The open request scopes; the word stays raised ``linger_s`` after the last one ends.
        #: Counted in native code where it builds (:mod:`.native_scopes`: ending a request then
        #: wakes no thread), else in Python (:mod:`.linger`).
        self.scopes: NativeScopes | PythonScopes = open_scopes(control, linger_s) or PythonScopes(
            control, linger_s
        )
        #: Entering a request (not one bridged by the linger) warms the GPU (:meth:`Gate.warm`);
        #: off unless ``GPREEMPT_REQUEST_WARM=1``.
        self.warm_requests = request_warm() if warm is None else warm
        self._watch_lock = threading.Lock()
        #: The blocks of the list watched now: views, descriptors and owners.
        self._blocks: list[WatchedBlock] = []
        #: The daemon's version of that list; 0 = none, or not all of it mapped.
        self._watch_version = 0
        #: Views no longer watched, not yet unmapped: since when, the view, its block's key
        #: (a list that names the block again reads it there).
        self._retired: list[tuple[float, ActivityView, tuple[int, int]]] = []
        self._watcher = threading.Thread(target=self._watch, name="gpreempt-session", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """While connected, wait for the daemon to go away; then release our own block at once
        (the gate open, no share, free to sleep) and offer it to the next daemon of the runtime
        directory, so the gate and the request count carry over."""
        while True:
            connection = self.client.connection
            connection.sock.settimeout(None)
            try:
                while (item := connection.receive()) is not None:
                    message, fds = item
                    if message.get("push") == "watch":
                        self._on_watch_push(message, fds)
                    else:
                        for fd in fds:
                            os.close(fd)
            except (OSError, ProtocolError):
                pass
            self.connected = False
            self._set_watched([], 0, stranded=True)
            try:
                self.control.release()
            except (ValueError, TypeError):
                return  # the block was closed during interpreter shutdown
            self.client.close()
            while not self._reconnect():
                time.sleep(RECONNECT_PERIOD_S)

    def _reconnect(self) -> bool:
        try:
            client = DaemonClient.connect(self.client.runtime_dir, timeout=2.0)
        except GpreemptError:
            return False
        try:
            reply = client.open_channel(
                self.control.memfd, self.control.doorbell, self._register, rank_gpu()
            )
        except (GpreemptError, ProtocolError, OSError):
            client.close()  # e.g. the launcher has not registered us again yet
            return False
        self.client = client
        self.task_id = reply["task_id"]
        self.connected = True
        return True

    def use_gate(self, gate: Gate) -> None:
        """The process's gate is installed: it watches what the daemon said to watch."""
        with self._watch_lock:
            self.gate = gate
            gate.watch([view.address for view in self._watched], self._watch_version)

    def use_driver_gate(self) -> None:
        """The driver-level gate holds this block: it watches what the daemon said to watch."""
        from .gate import driver

        with self._watch_lock:
            self.driver_gate = True
            driver.set_watch([view.address for view in self._watched], self._watch_version)

    def use_barriers(self, barriers: StreamBarriers) -> None:
        """The process's barrier thread runs: it waits for what the daemon said to watch."""
        with self._watch_lock:
            self.barriers = barriers
            barriers.watch([view.address for view in self._watched], self._watch_version)

    def watched_active(self) -> bool:
        """Whether a task that outranks this one on its GPU is active right now, as read from
        the blocks the daemon sent (False if it sent none)."""
        if not self._blocks:  # nothing watched: no lock needed to say so
            return False
        with self._watch_lock:
            return any(block.view.is_active() for block in self._blocks)

    def _gate_puts_barriers(self) -> bool:
        """Whether the gate may have put stream barriers that read watched blocks: those
        blocks then stay mapped for good (the GPU keeps their pages registered, and a new
        mapping at a reused address would be taken for the old one)."""
        gate = self.gate is not None and self.gate.config.barrier_ms > 0
        return gate or self.barriers is not None or self.driver_gate

    def must_wait(self) -> bool:
        """Whether the process should launch nothing now: its gate is closed (and not only
        while watched tasks are active that no longer are), or a watched task is active."""
        word = self.control.gate_word
        active = self.watched_active()
        return active or (word != 0 and not released_by_watch(word, self._watch_version, active))

    @property
    def _watched(self) -> list[ActivityView]:
        return [block.view for block in self._blocks]

    def _on_watch_push(self, message: dict[str, Any], fds: list[int]) -> None:
        """The daemon's watch list: a version, the tasks, their owners' pids and one fd each.
        One whose fds did not all arrive is not the list the daemon versioned."""
        version, tasks, pids = message.get("version"), message.get("tasks"), message.get("pids")
        complete = isinstance(tasks, list) and len(tasks) == len(fds)
        valid = isinstance(version, int) and complete
        self._set_watched(fds, version if valid else 0, pids if isinstance(pids, list) else [])

    def _set_watched(
        self, fds: list[int], version: int, pids: Sequence[object] = (), stranded: bool = False
    ) -> None:
        """Map the blocks the daemon sent (taking their fds) and watch them instead, as the
        daemon's list ``version``; ``pids``: their owners, in the same order. ``stranded``: the
        daemon is gone, and barriers may still wait on the blocks watched until now: a thread
        clears those whose owner exits with its words raised (:mod:`.stranded`)."""
        blocks: list[WatchedBlock] = []
        with self._watch_lock:
            kept = {block.key: block for block in self._blocks}
            retired = {key: view for _, view, key in self._retired}
        for i, fd in enumerate(fds):
            try:
                key, pid = block_key(fd), pids[i] if i < len(pids) else None
                if key in kept:  # watched already: read where it is, no new mapping
                    blocks.append(kept.pop(key).named(pid))
                    os.close(fd)
                    continue
                block = WatchedBlock.map(fd, pid, retired.get(key), key)
            except OSError:
                version = 0  # not the list the daemon versioned: its own closing still applies
                os.close(fd)
                continue
            blocks.append(block)
        now = time.monotonic()
        barriers = self._gate_puts_barriers()
        with self._watch_lock:
            addresses = [block.view.address for block in blocks]
            if self.gate is not None:
                self.gate.watch(addresses, version)
            if self.barriers is not None:
                self.barriers.watch(addresses, version)
            if self.driver_gate:
                from .gate import driver

                driver.set_watch(addresses, version)
            watched = {id(block) for block in blocks}
            old = [block for block in self._blocks if id(block) not in watched]
            self._blocks = blocks
            views = {id(block.view) for block in blocks}
            keep = [entry for entry in self._retired if id(entry[1]) not in views]  # watched again
            keep += [(now, block.view, block.key) for block in old]
            self._watch_version = version
            self._retired = []
            for since, view, key in keep:
                if now - since > UNMAP_AFTER_S and not barriers:
                    view.close()
                else:
                    self._retired.append((since, view, key))
        if stranded and old and barriers:
            threading.Thread(
                target=free_stranded, args=(old,), name="gpreempt-stranded", daemon=True
            ).start()
        else:
            for block in old:
                block.close()  # the descriptors; the views are retired above

    def enter_request(self, hint: bool = True) -> None:
        """One more open request scope; ``hint``: see :meth:`ControlBlock.set_requests`."""
        if self.scopes.enter(hint) and self.warm_requests and self.gate is not None:
            self.gate.warm()

    def exit_request(self) -> None:
        self.scopes.exit()


_session: Session | None = None
_session_lock = threading.Lock()
_tried_env = False


def current() -> Session | None:
    """The process's session, opening it from the environment on first use (``gpreempt run``)."""
    global _tried_env
    if _session is not None or _tried_env:
        return _session
    with _session_lock:
        if _session is None and not _tried_env:
            _tried_env = True
            if os.environ.get(ENV_TASK_ID):
                try:
                    _open(os.environ.get(ENV_RUNTIME_DIR), register=None)
                except UsageError as exc:
                    print(f"gpreempt: {exc}; this process runs without gpreempt", file=sys.stderr)
                except GpreemptError:
                    pass  # no daemon: run undisturbed, as if not under gpreempt
    return _session


def open_session(runtime_dir: str | None, register: dict[str, Any] | None) -> Session:
    """Open the session explicitly (``gpreempt.attach``); returns the existing one if open."""
    with _session_lock:
        if _session is not None:
            return _session
        return _open(runtime_dir, register)


def _open(runtime_dir: str | None, register: dict[str, Any] | None) -> Session:
    global _session
    linger_ms, warm = request_linger_ms(), request_warm()
    client = DaemonClient.connect(runtime_dir)
    control = ControlBlock.create()
    try:
        reply = client.open_channel(control.memfd, control.doorbell, register, rank_gpu())
    except (GpreemptError, ProtocolError, OSError) as exc:
        client.close()
        control.close()
        if isinstance(exc, GpreemptError):
            raise
        raise DaemonUnavailable(f"the daemon did not accept this process: {exc}") from None
    _session = Session(client, control, reply, register, linger_ms, warm)
    return _session


def _reset_after_fork() -> None:
    """A forked child does not share its parent's channel; it opens its own if it needs one."""
    global _session, _tried_env, _session_lock
    _session = None
    _tried_env = False
    _session_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
