"""Processes that take turns on the GPU, for the benchmarks that compare configurations of one
program side by side (``benchmarks/driver_gate/overhead.py``,
``benchmarks/defaults/server_activity.py``).

Each configuration is a long-lived process, started once (its start-up, compiling and warming
up, costs no turn); the benchmark writes whose turn it is into a file (:func:`give_turn`), and
the process whose id it names runs for one turn and appends a JSON line of what it measured to
its own file (:func:`take_turns`). Rounds in shuffled order then compare the configurations on
the same GPU at nearly the same moment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: The command that runs gpreempt's CLI in a child.
GPREEMPT = (sys.executable, "-m", "gpreempt")


def clean_env() -> dict[str, str]:
    """This process's environment without gpreempt's settings (but where its gates are built)
    or a CUDA tools library, unbuffered: what a process started plainly would have."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GPREEMPT_") or k == "GPREEMPT_CACHE_DIR"
    }
    env.pop("CUDA_INJECTION64_PATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def read_lines(path: Path) -> list[dict]:
    """The JSON lines a process appended to ``path`` so far (none while it cannot be read)."""
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def start_daemon(
    runtime: Path, env: dict[str, str], options: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """A private ``gpreempt serve`` in the new directory ``runtime``, once its socket is there
    (or after 20 s)."""
    runtime.mkdir(mode=0o700)
    daemon = subprocess.Popen(
        [*GPREEMPT, "serve", "--runtime-dir", str(runtime), *options],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not (runtime / "gpreempt.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return daemon


def run_under(runtime: Path) -> list[str]:
    """The start of a ``gpreempt run`` command under the daemon of ``runtime``."""
    return [*GPREEMPT, "run", "--runtime-dir", str(runtime)]


def wait_started(outs: Sequence[Path], procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Wait until every process created its output file; RuntimeError if one exits first or
    five minutes pass."""
    deadline = time.monotonic() + 300
    while not all(p.exists() for p in outs):
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError("a process did not start")
        time.sleep(0.2)


def give_turn(turn: Path, who: str, key: str, out: Path, timeout_s: float) -> None:
    """Give ``who`` the turn ``key`` and wait until its line for it is in ``out``; then nobody
    has the turn, for 0.3 s, so the next turn starts from an idle GPU. RuntimeError after
    ``timeout_s``."""
    turn.write_text(f"{who}:{key}")
    deadline = time.monotonic() + timeout_s
    while not any(x["turn"] == key for x in read_lines(out)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{who} did not finish its turn {key}")
        time.sleep(0.01)
    turn.write_text("")
    time.sleep(0.3)


def stop_all(turn: Path, procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Tell the processes to stop, then terminate them, the last started first."""
    turn.write_text("stop")
    time.sleep(0.5)
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def take_turns(turn: Path, me: str, out: Path, run: Callable[[str], dict[str, Any]]) -> None:
    """The side of the process that takes turns: create ``out`` (it has started), then each
    time ``turn`` gives ``me`` a turn it has not run (``ME:KEY``), append ``{"turn": KEY,
    **run(KEY)}`` to ``out``; return once ``turn`` says ``stop``."""
    out.write_text("")
    done: set[str] = set()
    while True:
        word = turn.read_text().strip() if turn.exists() else ""
        if word == "stop":
            return
        who, _, key = word.partition(":")
        if who != me or key in done:
            time.sleep(0.002)
            continue
        result = run(key)
        done.add(key)
        with out.open("a") as f:
            f.write(json.dumps({"turn": key, **result}) + "\n")
