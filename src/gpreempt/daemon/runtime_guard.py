"""The daemon's socket and runtime directory, watched from its loop: a deleted socket is bound
again; a runtime directory deleted or replaced is taken again where no other daemon took it,
else the daemon resumes every task and stops (two daemons never split the node)."""

from __future__ import annotations

import contextlib
import os
import selectors
from typing import Any, Protocol

from ..errors import GpreemptError


class Daemon(Protocol):
    """What of the daemon (server.py) this module uses."""

    claim: Any
    runtime_dir: Any
    lost: str | None
    stopping: bool
    events: Any
    state_files: Any
    lifecycle: Any
    selector: selectors.BaseSelector
    listener: Any
    connections: Any

    def log(self, line: str) -> None: ...

    def persist(self) -> None: ...


def check_runtime_dir(daemon: Daemon) -> None:
    """Notice a runtime directory deleted or replaced under the daemon: take it again if
    no other daemon did (the same clients find it where they look), else resume every
    task and stop, so that two daemons never split the node."""
    if daemon.claim.intact():
        return
    if daemon.claim.holds_directory():  # only the socket went: bind it again
        daemon.log(f"socket {daemon.claim.socket_path} was deleted or replaced; binding it again")
        relisten(daemon)
        return
    daemon.log(f"runtime directory {daemon.runtime_dir} was deleted or replaced")
    try:
        daemon.claim.take_lock()
    except GpreemptError as exc:
        daemon.log(f"cannot take it again ({exc}); resuming every task and stopping")
        daemon.lost = f"lost runtime directory {daemon.runtime_dir}: {exc}"
        daemon.stopping = True
        return
    relisten(daemon)
    daemon.events.reopen()
    daemon.state_files.forget()
    daemon.persist()
    daemon.lifecycle.persist_attached()
    daemon.events.write("daemon-start", reason="runtime directory recreated", pid=os.getpid())
    daemon.log(f"recreated {daemon.runtime_dir} and serving again")


def relisten(daemon: Daemon) -> None:
    """Close the listening socket and bind it again."""
    with contextlib.suppress(KeyError, ValueError):
        daemon.selector.unregister(daemon.listener)
    daemon.listener.close()
    daemon.connections.accept_paused_until = 0.0
    listen(daemon)


def listen(daemon: Daemon) -> None:
    """Bind the daemon's socket and listen on it from its loop."""
    daemon.listener = daemon.claim.listen()
    daemon.connections.listener = daemon.listener
    daemon.selector.register(daemon.listener, selectors.EVENT_READ, ("listen", None))
