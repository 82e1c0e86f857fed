"""``gpreempt stop``: stop this user's daemon cleanly.

The daemon stops as it does on SIGTERM: it resumes every task it suspended (nothing is left
stopped), records its attached tasks for the next daemon, and removes its socket. The tasks
run on without preemption; those started by ``gpreempt run`` register again with the next
daemon that answers (the next ``gpreempt run`` starts one).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import struct

from ..client.connection import DaemonClient
from ..config import resolve_runtime_dir
from ..errors import DaemonUnavailable, GpreemptError, PermissionDenied, UsageError
from . import add_runtime_dir

#: Seconds to wait for the daemon to resume its tasks and exit, by default.
DEFAULT_TIMEOUT_S = 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stop",
        help="stop the daemon; every task is resumed and runs on",
        description=(
            "Stop the daemon of the runtime directory (the one `gpreempt run` started in the "
            "background, or a `gpreempt serve`). It resumes every task first, so nothing is "
            "left suspended; the tasks run on without preemption, and those started by "
            "`gpreempt run` register again with the next daemon."
        ),
    )
    add_runtime_dir(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds to wait for it to exit (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout}")
    try:
        client = DaemonClient.connect(args.runtime_dir, timeout=5.0)
    except DaemonUnavailable:
        where = resolve_runtime_dir(args.runtime_dir)
        print(f"no daemon answers at {where}: nothing to stop")
        return 0
    with client:
        pid = daemon_pid(client)
        tasks = len(client.status().get("tasks", []))
        runtime_dir = client.runtime_dir
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        print(f"the daemon (pid {pid}) has already exited")
        return 0
    try:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        except PermissionError:
            raise PermissionDenied(
                f"the daemon at {runtime_dir} (pid {pid}) runs as another user: stop it as "
                "that user or as root"
            ) from None
        if not select.select([pidfd], [], [], args.timeout)[0]:
            raise GpreemptError(
                f"the daemon (pid {pid}) did not exit within {args.timeout:g} s; see its log "
                f"in {runtime_dir}"
            )
    finally:
        os.close(pidfd)
    note = f"; {tasks} task{'s' if tasks != 1 else ''} run on without preemption" if tasks else ""
    print(f"stopped the daemon (pid {pid}, {runtime_dir}): nothing is suspended{note}")
    return 0


def daemon_pid(client: DaemonClient) -> int:
    """The daemon's pid as this process sees it: the kernel's word for the socket's peer
    (a daemon in another pid namespace names itself by a pid that means another process
    here), checked against what the daemon says when both are in one namespace."""
    sock = client.connection.sock
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    if pid <= 0:
        raise DaemonUnavailable(
            f"the daemon at {client.runtime_dir} runs in another pid namespace: stop it there"
        )
    client.ping()  # it answers: the socket is a daemon's, not a leftover
    return pid
