"""The ``gpreempt`` command: one module per subcommand, each with ``register(subparsers)``.

Open the module named after the command (``gpreempt status`` is :mod:`.status`); the manual
``suspend``, ``resume``, ``evict``, ``restore`` and ``detach`` share :mod:`.manual`. Modules
whose name starts with ``_`` are helpers of several commands (:mod:`._task_options`, the
options of ``run`` and ``attach``) or of one (:mod:`._analyze_tables`). The commands parse and
print; the work is below them: ``run`` in :mod:`gpreempt.client.launcher`, ``serve`` in
:mod:`gpreempt.daemon` (``stop`` signals it), ``bench`` and ``demo`` in :mod:`gpreempt.bench`,
``top``, ``queues`` and ``analyze`` in :mod:`gpreempt.monitor`. :func:`main` is the entry point.

A subcommand's handler takes the parsed arguments and returns the exit code. Every command
follows one convention (``gpreempt run`` returns its command's code once that has started):

====  =====================================================================================
0     done
1     could not be done: no daemon answers, no such task, permission denied, a mechanism
      or the profiled command failed
2     bad input: an unknown option, a bad port, size, pid, priority or setting
130   interrupted (Ctrl-C) before it was done; ``--follow`` and live views exit 0 on Ctrl-C
====  =====================================================================================

Errors are printed as one line, ``gpreempt COMMAND: error: what was wrong; what to do``,
never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import GpreemptError, UsageError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit with :data:`EXIT_USAGE`."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: Subcommand modules, in the order ``--help`` lists them.
SUBCOMMANDS = (
    "demo",
    "serve",
    "stop",
    "run",
    "attach",
    "status",
    "events",
    "manual",
    "top",
    "queues",
    "analyze",
    "bench",
    "selftest",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpreempt",
        description=(
            "Let latency-critical GPU work preempt best-effort GPU work on shared GPUs. "
            "Start jobs with `gpreempt run --priority high|low -- CMD`; a node daemon "
            "suspends the less important ones while a more important one uses the GPU."
        ),
        epilog="exit codes: 0 done, 1 could not be done (no daemon, no such task, ...), "
        "2 bad input; `run` returns its command's code",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"gpreempt {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
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
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand's parser, which knows its options
        innermost(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    prog = getattr(args, "prog", None) or f"gpreempt {args.subcommand}"
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GpreemptError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0


def innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The parser of the (sub)command ``args`` were parsed for: ``gpreempt analyze trace``'s
    for ``gpreempt analyze trace --bad``."""
    while True:
        chosen = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, action.dest, None) or "")
        if chosen is None:
            return parser
        parser = chosen


def add_runtime_dir(parser: argparse.ArgumentParser) -> None:
    """The ``--runtime-dir`` option every daemon-facing subcommand shares."""
    parser.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="daemon directory (default: $GPREEMPT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/gpreempt, "
        "else /tmp/gpreempt-<uid>)",
    )


def port_number(text: str) -> int:
    """An argparse ``type`` for a TCP port: 1 to 65535, one clear line otherwise."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range: use 1-65535")
    return port


def process_id(text: str) -> int:
    """An argparse ``type`` for a process id: a whole number of 1 or more."""
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (a number)") from None
    if pid < 1:
        raise argparse.ArgumentTypeError(f"{pid} is not a process id: give a number of 1 or more")
    return pid
