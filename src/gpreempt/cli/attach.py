"""``gpreempt attach``: register a process that is already running."""

from __future__ import annotations

import argparse

from ..client.connection import DaemonClient
from ..messages import RegisterRequest
from . import add_runtime_dir, process_id
from ._task_options import add_mechanism_option, add_task_options, task_fields


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "attach",
        help="register a running process (any CUDA program) as a task",
        description=(
            "Register a process that is already running, PyTorch or not. Only your own "
            "processes (root: any). The task ends when the process exits. Without "
            "--always-active the process counts as active only through gpreempt.request() "
            "in its code, so a high-priority process usually wants --always-active."
        ),
        epilog="example: gpreempt attach --pid 4242 --priority low",
    )
    add_runtime_dir(parser)
    parser.add_argument("--pid", type=process_id, required=True, help="process to register")
    add_task_options(parser)
    add_mechanism_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fields = task_fields(args, check=True)
    with DaemonClient.connect(args.runtime_dir) as client:
        reply = client.send(RegisterRequest(pid=args.pid, task=fields))
    task = reply["task"]
    print(
        f"registered pid {task['pid']} as {task['name']!r} (priority {task['priority_name']}, "
        f"GPU {','.join(map(str, task['gpus']))}, mechanism {task['mechanism']})"
    )
    return 0
