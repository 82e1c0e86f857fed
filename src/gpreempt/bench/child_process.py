"""One process of a scenario (:class:`Child`), in a process group of its own so that stopping
it also stops what it started, and the files it hands results back in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .scenario_catalog import ScenarioFailed


@dataclass
class Child:
    """One started process with its log file, in its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    files: dict[str, Path] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        env: dict[str, str],
        directory: Path,
        files: dict[str, Path] | None = None,
    ) -> Child:
        log_path = directory / f"{name}.log"
        with open(log_path, "wb") as log:
            try:
                popen = subprocess.Popen(
                    argv,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ScenarioFailed(f"cannot start {name} ({shlex.join(argv)}): {exc}") from None
        return cls(name, popen, log_path, files or {})

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 1500) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-chars:].strip()

    def failure(self, what: str) -> ScenarioFailed:
        return ScenarioFailed(
            f"{self.name} {what} (exit code {self.popen.returncode}); end of {self.log_path.name}: "
            f"{self.tail(600)!r}"
        )

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signum)

    def stop(self, grace_s: float = 15.0, signum: int = signal.SIGTERM) -> None:
        """Ask the process group to end (``signum``), then SIGKILL it after ``grace_s``."""
        if self.alive():
            self.signal_group(signum)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.popen.wait(10)
        self.signal_group(signal.SIGKILL)  # anything the process left behind in its group


def wait_ready(children: Sequence[Child], timeout_s: float, user_cmd_grace: float) -> None:
    """Wait until every child wrote its ready file (a user's Case-B command that writes none is
    taken as ready after ``user_cmd_grace`` seconds); fail if one exits first."""
    deadline = time.monotonic() + timeout_s
    pending = list(children)
    while pending:
        for child in list(pending):
            if child.files["ready"].exists():
                pending.remove(child)
            elif not child.alive():
                raise child.failure("exited before it was ready")
            elif child.files.get("user_cmd") and time.time() - child.started > user_cmd_grace:
                pending.remove(child)
        if pending and time.monotonic() > deadline:
            names = ", ".join(c.name for c in pending)
            raise ScenarioFailed(f"{names} not ready after {timeout_s:.0f} s")
        time.sleep(0.02)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def user_steps(path: Path) -> list[float] | None:
    """Step times a user's Case-B command appended to $GPREEMPT_BENCH_STEPS_FILE, if any."""
    try:
        lines = path.read_text().split()
    except OSError:
        return None
    times = []
    for word in lines:
        try:
            times.append(float(word))
        except ValueError:
            continue
    return sorted(times)
