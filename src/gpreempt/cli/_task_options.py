"""Options shared by ``gpreempt run`` and ``gpreempt attach``, and their parsing."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..field_checks import MAX_GPU_INDEX, MAX_GPUS, MAX_RESERVE_BYTES
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
        help="count the task as wanting the GPU all the time (for programs whose GPU launches "
        "gpreempt cannot see: attached processes without PyTorch or gpreempt.request())",
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
    if len(gpus) > MAX_GPUS:
        raise UsageError(f"--gpu {value!r}: a task uses at most {MAX_GPUS} GPUs")
    count = gpu_count()
    for gpu in gpus:
        if gpu > MAX_GPU_INDEX or (count and gpu >= count and not has_gpu_node(gpu)):
            have = f"GPUs 0-{count - 1}" if count else "no GPU"
            raise UsageError(f"--gpu {value}: there is no GPU {gpu} on this machine ({have})")
    if not count and any(gpus):
        print(
            f"gpreempt: no GPU found on this machine: --gpu {value} only groups tasks "
            "(tasks on one index compete for it)",
            file=sys.stderr,
        )
    return gpus


def gpu_count() -> int:
    """GPUs this machine shows (NVIDIA device nodes, AMD KFD nodes); 0 if none is found."""
    nvidia = [p for p in Path("/dev").glob("nvidia*") if p.name[6:].isdigit()]
    amd = 0
    for gpu_id in Path("/sys/class/kfd/kfd/topology/nodes").glob("*/gpu_id"):
        with contextlib.suppress(OSError, ValueError):
            amd += int(gpu_id.read_text().strip() or 0) != 0
    return len(nvidia) + amd


def has_gpu_node(index: int) -> bool:
    """Whether NVIDIA's device node of GPU ``index`` exists (a container may show only some)."""
    return Path(f"/dev/nvidia{index}").exists()


def parse_size(value: str | None) -> int:
    """``"20GiB"``, ``"512M"``, ``"1e9"`` -> bytes."""
    if not value:
        return 0
    match = _SIZE.match(value)
    if not match:
        raise UsageError(f"bad memory size {value!r}: use e.g. 20GiB, 512MiB or 4G")
    number, prefix, binary = match.groups()
    base = 1024 if binary else 1000
    size = int(float(number) * (base ** _POWERS[prefix.lower()] if prefix else 1))
    if size > MAX_RESERVE_BYTES:
        raise UsageError(f"memory size {value!r} is more than any GPU has (at most 1 PiB)")
    return size


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
