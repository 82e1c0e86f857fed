"""``gpreempt suspend|resume|evict|restore|detach``: manual control of one task."""

from __future__ import annotations

import argparse

from ..client.connection import DaemonClient
from . import add_runtime_dir

_HELP = {
    "suspend": "hold a task suspended until `gpreempt resume`, whatever the policy says",
    "resume": "release a task held by `gpreempt suspend` (the policy decides again)",
    "evict": "move a task's GPU memory to host memory and free it (NVIDIA driver checkpoint)",
    "restore": "bring an evicted task's GPU memory back (waits for room on the GPU)",
    "detach": "unregister a task: it is resumed and runs on, no longer preempted",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    for verb, text in _HELP.items():
        parser = subparsers.add_parser(
            verb, help=text, description=text[0].upper() + text[1:] + "."
        )
        add_runtime_dir(parser)
        parser.add_argument("target", metavar="NAME|PID", help="task name or pid")
        parser.set_defaults(func=run, verb=verb)


def run(args: argparse.Namespace) -> int:
    with DaemonClient.connect(args.runtime_dir) as client:
        if args.verb in ("suspend", "resume"):
            reply = client.hold(args.target, args.verb == "suspend")
        elif args.verb == "evict":
            reply = client.evict(args.target)
        elif args.verb == "detach":
            reply = client.detach(args.target)
            task = reply["task"]
            print(f"{task['name']} ({task['pid']}): detached")
            return 0
        else:
            reply = client.restore(args.target)
    task = reply["task"]
    line = f"{task['name']} ({task['pid']}): {task['state']}"
    if task.get("evicted_bytes"):
        line += f", {task['evicted_bytes'] / 2**30:.2f} GiB on the host"
    if reply.get("pending"):
        line += " (not enough free GPU memory yet: restores automatically when there is room)"
    print(line)
    return 0
