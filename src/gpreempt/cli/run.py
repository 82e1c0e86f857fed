"""``gpreempt run``: start a command as a task under the daemon."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..names import MechanismName
from . import add_runtime_dir
from ._task_options import add_mechanism_option, add_task_options, parse_size, task_fields


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..policy import POLICIES

    parser = subparsers.add_parser(
        "run",
        help="run a command as a task with a priority",
        description=(
            "Start CMD as a task with a priority. Starts a daemon in the background if none "
            "answers, forwards SIGINT/SIGTERM to CMD, and exits with CMD's exit code. Python "
            "commands get the in-process client (request(), launch gate, automatic activity) "
            "without code changes. If the daemon goes away, CMD is resumed and keeps running."
        ),
        epilog="example: gpreempt run --priority low -- python train.py",
    )
    add_runtime_dir(parser)
    add_task_options(parser)
    add_mechanism_option(parser)
    parser.add_argument(
        "--reserve-memory",
        metavar="SIZE",
        help="GPU memory (e.g. 20GiB) to keep free for this task while it is active, by "
        "evicting less important tasks' memory to the host",
    )
    parser.add_argument(
        "--policy",
        choices=sorted(POLICIES),
        help="policy for a daemon this command starts (one already running keeps its own, "
        "with a warning)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..client.gate.scopes_build import build_ahead
    from ..client.launcher import Launcher
    from ..config import idle_grace_ms, request_linger_ms, request_warm

    idle_grace_ms(), request_linger_ms(), request_warm()  # a bad setting fails here, not in CMD
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given: use `gpreempt run [OPTIONS] -- CMD ARGS...`")
    if args.mechanism == MechanismName.KFD:  # refuse before anything starts, with the reason
        from ..errors import MechanismUnavailable
        from ..mechanisms.kfd_session import check_available

        try:
            check_available()
        except MechanismUnavailable as exc:
            raise MechanismUnavailable(
                f"mechanism 'kfd' is not available here: {exc}; use --mechanism gate or signal"
            ) from None
    spec = task_fields(args, reserve_bytes=parse_size(args.reserve_memory))
    build_ahead()  # the native request counter, so that no request() waits for the compiler
    return Launcher(command, spec, args.runtime_dir, args.policy).run()
