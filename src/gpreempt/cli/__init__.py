"""The ``gpreempt`` command: one module per subcommand, each with ``register(subparsers)``.

A subcommand's handler takes the parsed arguments and returns the exit code. Errors a user
can fix (GpreemptError) are printed as one line and exit with code 2 for bad input, 1 for
anything else; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ..errors import GpreemptError, UsageError

#: Subcommand modules, in the order ``--help`` lists them.
SUBCOMMANDS = (
    "demo",
    "serve",
    "run",
    "attach",
    "status",
    "events",
    "control",
    "top",
    "queues",
    "analyze",
    "bench",
    "selftest",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpreempt",
        description=(
            "Let latency-critical GPU work preempt best-effort GPU work on shared GPUs. "
            "Start jobs with `gpreempt run --priority high|low -- CMD`; a node daemon "
            "suspends the less important ones while a more important one uses the GPU."
        ),
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"gpreempt {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue  # subcommand not built into this installation
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"gpreempt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except GpreemptError as exc:
        print(f"gpreempt {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0


def add_runtime_dir(parser: argparse.ArgumentParser) -> None:
    """The ``--runtime-dir`` option every daemon-facing subcommand shares."""
    parser.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="daemon directory (default: $GPREEMPT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/gpreempt, "
        "else /tmp/gpreempt-<uid>)",
    )
