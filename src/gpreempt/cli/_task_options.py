"""Options shared by ``gpreempt run`` and ``gpreempt attach``, and their parsing."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from ..errors import UsageError
from ..messages import TaskFields
from ..names import MechanismName
from ..policy.share import check_min_share
from ..policy.timeslice import check_timeslice_ms

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?))?b?\s*$", re.IGNORECASE)
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}


def add_task_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--priority",
        "-p",
        default="normal",
        help="high, normal, low, or an integer from -255 to 255 (larger = more important; "
        "high=100, normal=0, low=-100). Default: normal",
    )
    parser.add_argument(
        "--gpu",
        default=None,
        metavar="N[,N...]",
        help="GPU index(es) the task uses (default: first of CUDA_VISIBLE_DEVICES, else 0)",
    )
    parser.add_argument("--name", help="task name shown in status and events")
    parser.add_argument(
        "--always-active",
        action="store_true",
        help="count the task as wanting the GPU all the time (for programs with neither "
        "gpreempt.request() nor PyTorch)",
    )
    parser.add_argument(
        "--timeslice-ms",
        type=float,
        metavar="MS",
        help="time slice under the timeslice policy (default by priority)",
    )
    parser.add_argument(
        "--min-share",
        type=float,
        metavar="F",
        help="guaranteed fraction of GPU time under the share policy (0 < F <= 1)",
    )


def add_mechanism_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mechanism",
        "-m",
        default=MechanismName.AUTO,
        choices=MechanismName.texts(),
        help="how to suspend the task: gate (in-process launch gate; on NVIDIA it also holds "
        "queued work on the GPU with stream barriers, so a training task keeps the most "
        "throughput), lock (NVIDIA driver lock), signal (SIGSTOP/SIGCONT), kfd (AMD: "
        "SIGSTOP and the GPU queues unmapped through KFD; `run` only), auto (best "
        "available; default)",
    )


def parse_gpus(value: str | None) -> tuple[int, ...]:
    """``"0,1"`` -> (0, 1); None -> first visible device, else 0."""
    if value is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        return (int(visible),) if visible.isdigit() else (0,)
    try:
        gpus = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--gpu {value!r}: give GPU indexes such as 0 or 0,1") from None
    if not gpus or any(g < 0 for g in gpus):
        raise UsageError(f"--gpu {value!r}: give non-negative GPU indexes such as 0 or 0,1")
    return gpus


def parse_size(value: str | None) -> int:
    """``"20GiB"``, ``"512M"``, ``"1e9"`` -> bytes."""
    if not value:
        return 0
    match = _SIZE.match(value)
    if not match:
        raise UsageError(f"bad memory size {value!r}: use e.g. 20GiB, 512MiB or 4G")
    number, prefix, binary = match.groups()
    if not prefix:
        return int(float(number))
    base = 1024 if binary else 1000
    return int(float(number) * base ** _POWERS[prefix.lower()])


def task_fields(args: argparse.Namespace, **extra: Any) -> TaskFields:
    """What run and attach register the task with, checked before anything starts (the
    priority and the mechanism by TaskFields itself); ``extra``: the other fields."""
    if args.timeslice_ms is not None:
        check_timeslice_ms(args.timeslice_ms)
    if args.min_share is not None:
        check_min_share(args.min_share)
    return TaskFields(
        priority=args.priority,
        gpus=parse_gpus(args.gpu),
        name=args.name,
        mechanism=args.mechanism,
        always_active=args.always_active,
        timeslice_ms=args.timeslice_ms,
        min_share=args.min_share,
        **extra,
    )
