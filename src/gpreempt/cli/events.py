"""``gpreempt events``: the daemon's event log."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..config import EVENTS_NAME, resolve_runtime_dir
from ..errors import DaemonUnavailable, UsageError
from . import add_runtime_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "events",
        help="show the event log (registrations, activity, suspensions)",
        description="Show the daemon's event log: registered, active, idle, suspend, resume, "
        "hold, release, evict, restore, exit, each with time, GPU, task, mechanism and how "
        "long the mechanism's call took.",
    )
    add_runtime_dir(parser)
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--json", action="store_true", help="print raw JSON lines")
    parser.add_argument(
        "--last",
        "-n",
        type=int,
        default=50,
        metavar="N",
        help="how many past events to show (default 50; 0 = all)",
    )
    parser.set_defaults(func=run)


def format_event(record: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.get("t", 0)))
    millis = int((record.get("t", 0) % 1) * 1000)
    parts = [f"{stamp}.{millis:03d}", f"{record.get('event', '?'):<10}"]
    if record.get("gpu") is not None:
        parts.append(f"gpu{record['gpu']}")
    if record.get("task"):
        parts.append(f"{record['task']}({record.get('pid')})")
    if record.get("mechanism"):
        parts.append(f"via {record['mechanism']}")
    if record.get("latency_ms") is not None:
        parts.append(f"{record['latency_ms']:.3f} ms")
    if record.get("reason"):
        parts.append(f"- {record['reason']}")
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    from ..daemon.event_log import follow_events, read_all_events

    path = resolve_runtime_dir(args.runtime_dir) / EVENTS_NAME
    if args.last < 0:
        raise UsageError("--last must be >= 0")
    if not path.exists() and (not args.follow or not path.parent.is_dir()):
        raise DaemonUnavailable(
            f"no event log at {path}: no daemon has run with this runtime directory; start "
            "one with `gpreempt serve`, or give its --runtime-dir"
        )
    if not path.exists():  # --follow in a directory a daemon will use: wait, and say so
        print(f"no events yet at {path}: waiting for a daemon (Ctrl-C stops)", file=sys.stderr)

    def show(record: dict[str, Any]) -> None:
        print(json.dumps(record) if args.json else format_event(record), flush=True)

    if path.exists():
        past = list(read_all_events(path))
        for record in past[-args.last :] if args.last else past:
            show(record)
    if args.follow:
        try:
            for record in follow_events(path):
                show(record)
        except KeyboardInterrupt:
            return 0
    return 0
