"""Run a Python script under ``torch.profiler`` and export a Chrome trace.

Usage::

    python -m gpreempt.monitor.trace_wrapper OUT.json [--duration S] [--warmup S] \\
        -- script.py [ARGS...]
    python -m gpreempt.monitor.trace_wrapper OUT.json -- -m package.module [ARGS...]

The script runs in this process (``runpy``) with ``sys.argv`` set to its own arguments, so
it behaves as if started directly. Profiling (CPU and CUDA activity; CUDA covers ROCm too)
starts after ``--warmup`` seconds and stops after ``--duration`` seconds or when the script
ends, whichever comes first; a script still running then is interrupted (KeyboardInterrupt)
and the trace is written anyway. Bounded time keeps traces of endless training loops small.

Only this process's GPU work is traced; child processes the script starts are not. Without
PyTorch it exits with :data:`EXIT_NO_TORCH` before running the script.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import threading
import time
from collections.abc import Sequence

#: The exit code when PyTorch cannot be imported (the script never ran).
EXIT_NO_TORCH = 4


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        raise SystemExit(
            "usage: python -m gpreempt.monitor.trace_wrapper OUT.json [--duration S] "
            "-- script.py [ARGS...]"
        )
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m gpreempt.monitor.trace_wrapper")
    parser.add_argument("out", help="where to write the Chrome trace (.json or .json.gz)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds to profile")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds before profiling")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        parser.error("no script given after --")
    return args, command


def main(argv: Sequence[str] | None = None) -> int:
    args, command = _parse(sys.argv[1:] if argv is None else argv)
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        print(
            f"trace_wrapper: the profiler is PyTorch's and it cannot be imported ({exc}); "
            "the script did not run",
            file=sys.stderr,
        )
        return EXIT_NO_TORCH

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    else:
        print("trace_wrapper: no GPU visible to torch; tracing CPU only", file=sys.stderr)

    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    state = {"started": False, "stopped": False}
    lock = threading.Lock()

    def start() -> None:
        with lock:
            if not state["started"]:
                prof.__enter__()
                state["started"] = True

    def timer() -> None:
        time.sleep(args.warmup + args.duration)
        with lock:
            if not state["stopped"]:
                _interrupt_main()

    # The profiler must start and stop on the thread that runs the work.
    if args.warmup > 0:
        # Start on the script's own thread at its first call after the warmup.
        start_at = time.monotonic() + args.warmup

        def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
            if time.monotonic() >= start_at:
                sys.setprofile(None)
                start()
            return None

        sys.setprofile(tracer)
    else:
        start()
    threading.Thread(target=timer, daemon=True).start()

    exit_code = 0
    try:
        if command[0] == "-m":
            if len(command) < 2:
                raise SystemExit("trace_wrapper: -m needs a module name")
            sys.argv = command[1:]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = command
            sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
            runpy.run_path(command[0], run_name="__main__")
    except KeyboardInterrupt:
        print("trace_wrapper: time is up, stopping the script", file=sys.stderr)
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.setprofile(None)
        with lock:
            state["stopped"] = True
        if state["started"]:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(args.out)
            print(f"trace_wrapper: wrote {args.out}", file=sys.stderr)
        else:
            print("trace_wrapper: script ended before profiling started", file=sys.stderr)
            exit_code = exit_code or 3
    return exit_code


def _interrupt_main() -> None:
    """Raise KeyboardInterrupt in the main thread (the script's), at its next bytecode."""
    import _thread

    _thread.interrupt_main()


if __name__ == "__main__":
    raise SystemExit(main())
