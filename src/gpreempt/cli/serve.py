"""``gpreempt serve``: run the node daemon in the foreground."""

from __future__ import annotations

import argparse
import math
import sys

from ..config import resolve_runtime_dir
from ..errors import UsageError
from ..names import PolicyName
from . import add_runtime_dir, port_number


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..daemon.backstop import DEFAULT_DELAY_MS
    from ..daemon.prometheus import DEFAULT_METRICS_ADDR, DEFAULT_METRICS_PORT
    from ..policy import POLICIES
    from ..policy.inflight import DEFAULT_BUDGET_MS
    from ..policy.sleep import DEFAULT_SLEEP_AFTER_S
    from ..policy.turns import DEFAULT_TURN_MS

    parser = subparsers.add_parser(
        "serve",
        help="run the node daemon (in the foreground)",
        description=(
            "Run the node daemon: it keeps the registry of tasks per GPU and suspends less "
            "important tasks while a more important one on the same GPU is active. "
            "SIGTERM or Ctrl-C resumes every suspended task, then exits."
        ),
    )
    add_runtime_dir(parser)
    parser.add_argument(
        "--policy",
        default=PolicyName.HPF,
        choices=sorted(POLICIES),
        help="scheduling policy (default: hpf = strict priority)",
    )
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        nargs="?",
        const=DEFAULT_METRICS_PORT,
        metavar="PORT",
        help="serve Prometheus metrics on PORT (alone: the default port "
        f"{DEFAULT_METRICS_PORT}); off unless given",
    )
    parser.add_argument(
        "--metrics-addr",
        default=DEFAULT_METRICS_ADDR,
        metavar="ADDR",
        help=f"address the metrics listen on (default {DEFAULT_METRICS_ADDR}: this machine "
        "only; 0.0.0.0 or :: for a Prometheus elsewhere, which then sees task names)",
    )
    parser.add_argument(
        "--lock-timeout-ms",
        type=int,
        metavar="MS",
        help="how long a driver lock may wait for a task's queued work (default 5000)",
    )
    parser.add_argument(
        "--inflight-budget-ms",
        type=float,
        default=DEFAULT_BUDGET_MS,
        metavar="MS",
        help="GPU work (ms, as the gates estimate it) that the gated tasks of one GPU may keep "
        "queued together while a more important task is registered there, split equally among "
        "them: smaller shortens that task's wait when it starts and costs the others "
        f"throughput (default {DEFAULT_BUDGET_MS:g}; 0 = each gate's own window)",
    )
    parser.add_argument(
        "--turn-ms",
        type=float,
        default=DEFAULT_TURN_MS,
        metavar="MS",
        help="(policy hpf) gated tasks of equal priority that share a GPU with a more important "
        "task launch one at a time, in turns of this long (shorter when the holder goes idle), "
        "each with the whole in-flight budget, so that the important task waits for one queue "
        f"rather than several (default {DEFAULT_TURN_MS:g}; 0 = side by side)",
    )
    parser.add_argument(
        "--backstop-ms",
        type=float,
        default=DEFAULT_DELAY_MS,
        metavar="MS",
        help="with --mechanism auto (the default), also lock a task in the NVIDIA driver once "
        "its gate has held it this long, so that launches the gate cannot see stop too, unless "
        "its gate puts stream barriers (which hold them on the GPU); default "
        f"{DEFAULT_DELAY_MS:g}, 0 = never",
    )
    parser.add_argument(
        "--sleep-after-s",
        type=float,
        default=DEFAULT_SLEEP_AFTER_S,
        metavar="S",
        help="(policy hpf) once every more important task on its GPU has been idle this long, "
        "a gated task's gate sleeps: its per-operator hook is off and costs nothing, until one "
        "starts again; meanwhile a thread of the gate puts its stream barriers, and a task that "
        "queues more than its GPU runs stays awake "
        f"(default {DEFAULT_SLEEP_AFTER_S:g}; 0 = never)",
    )
    parser.add_argument(
        "--no-watch",
        action="store_true",
        help="gates stop only when this daemon closes them; by default (policy hpf) a gated "
        "task also watches the activity of its user's more important tasks on its GPU and "
        "stops at its next operator when one starts, without waiting for the daemon",
    )
    parser.add_argument(
        "--no-watch-resume",
        action="store_true",
        help="a gate stopped for a more important task waits for this daemon to open it again; "
        "by default a gate that watches every task it waits for goes on by itself the moment "
        "none of them is active",
    )
    parser.add_argument(
        "--shared",
        action="store_true",
        help="(root only) let every user's processes register; each still acts only on its own",
    )
    parser.add_argument(
        "--max-user-priority",
        default="normal",
        metavar="PRIORITY",
        help="with --shared: the highest priority users other than root may ask for "
        "(default: normal)",
    )
    parser.add_argument(
        "--allow-priority",
        action="append",
        default=[],
        metavar="USER=PRIORITY",
        help="with --shared: let USER (a name or uid) ask for priorities up to PRIORITY; "
        "repeat for several users",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..daemon.limits import Limits, parse_allowance
    from ..daemon.server import Daemon
    from ..priority import parse_priority

    for flag, value in (
        ("--inflight-budget-ms", args.inflight_budget_ms),
        ("--backstop-ms", args.backstop_ms),
        ("--turn-ms", args.turn_ms),
        ("--sleep-after-s", args.sleep_after_s),
    ):
        if not 0 <= value < math.inf:  # also refuses nan
            unit = "s" if flag.endswith("-s") else "ms"
            raise UsageError(f"{flag} must be a finite number of {unit}, 0 or more, not {value:g}")
    limits = Limits(
        shared=args.shared,
        max_user_priority=parse_priority(args.max_user_priority),
        allowed=dict(parse_allowance(text) for text in args.allow_priority),
    )
    daemon = Daemon(
        resolve_runtime_dir(args.runtime_dir),
        limits=limits,
        policy=args.policy,
        shared=args.shared,
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
        lock_timeout_ms=args.lock_timeout_ms,
        inflight_budget_ms=args.inflight_budget_ms,
        backstop_ms=args.backstop_ms,
        watch=not args.no_watch,
        watch_resume=not args.no_watch_resume,
        turn_ms=args.turn_ms,
        sleep_after_s=args.sleep_after_s,
        log=lambda message: print(f"gpreempt serve: {message}", file=sys.stderr, flush=True),
    )
    daemon.start()
    daemon.serve_forever()
    return 0
