"""A private ``gpreempt serve`` for one scenario, and the ``gpreempt run`` lines of its tasks.

Its runtime directory is a short temporary one (unix socket paths are short); when it stops,
its event log and log are copied into the scenario's directory.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import GpreemptError
from ..names import PolicyName
from . import daemon_events
from .child_process import Child
from .scenario_catalog import ScenarioFailed


class PrivateDaemon:
    """A private ``gpreempt serve`` in a short temporary runtime directory."""

    def __init__(self, gpreempt: Sequence[str], serve_args: Sequence[str], directory: Path) -> None:
        self.gpreempt = tuple(gpreempt)  # how to run the command `gpreempt`
        self.serve_args = tuple(serve_args)  # extra options of `gpreempt serve`
        self.directory = directory
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="gpb-"))
        self.child: Child | None = None

    def start(self, env: dict[str, str], policy: str = PolicyName.HPF) -> None:
        argv = [*self.gpreempt, "serve", "--runtime-dir", str(self.runtime_dir)]
        argv += ["--policy", policy, *self.serve_args]
        self.child = Child.start("daemon", argv, env, self.directory)
        from ..client.connection import DaemonClient
        from ..errors import DaemonUnavailable

        deadline = time.monotonic() + 30
        while True:
            if not self.child.alive():
                raise self.child.failure("(gpreempt serve) exited at start")
            try:
                with DaemonClient.connect(self.runtime_dir, timeout=2) as client:
                    client.ping()
                return
            except (DaemonUnavailable, OSError, GpreemptError):
                if time.monotonic() > deadline:
                    raise ScenarioFailed("gpreempt serve did not answer within 30 s") from None
                time.sleep(0.05)

    def wrap(
        self,
        argv: list[str],
        name: str,
        priority: str,
        mechanism: str | None,
        options: Sequence[str] = (),
    ) -> list[str]:
        wrapped = [*self.gpreempt, "run", "--runtime-dir", str(self.runtime_dir)]
        wrapped += ["--priority", priority, "--name", name]
        if mechanism:
            wrapped += ["--mechanism", mechanism]
        return [*wrapped, *options, "--", *argv]

    def events(self) -> list[dict[str, Any]]:
        """The event log so far (while the daemon runs)."""
        return daemon_events.read_log(self.runtime_dir / "events.jsonl")

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM the daemon (it resumes every task), keep its event log and log."""
        if self.child is not None:
            self.child.stop(grace_s=15)
        for name in ("events.jsonl.1", "events.jsonl", "daemon.log"):
            source = self.runtime_dir / name
            if source.exists():
                shutil.copy(source, self.directory / name)
        events = daemon_events.read_log(self.directory / "events.jsonl")
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        return events
