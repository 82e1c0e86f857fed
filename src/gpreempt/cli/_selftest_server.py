"""The more important task that the self-test's gate rows register beside their job.

Stream barriers (the operator gate's and the driver-level gate's) are put only while the
daemon gives the job an in-flight share, and it gives one only while a more important task is
registered on the job's GPU (:mod:`gpreempt.policy.inflight`): with the job alone they are
never put, and cannot be shown to hold anything. So for the gate and driver-gate rows the
self-test starts ``gpreempt run --priority high --name selftest-server`` over
:data:`SERVER`, a small Python program that uses no GPU and stays idle: it prints its pid
once it runs (registered by then: the launcher registers a command before it lets it run)
and exits when its stdin closes.

Like the job, the server and its launcher die with the self-test (``PR_SET_PDEATHSIG``, and
the reaper of :class:`~._selftest_probe.Workspace` kills what it recorded); its stdin closing
ends it as well.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from ._selftest_probe import Workspace, die_with_parent, stop_process

SERVER_NAME = "selftest-server"

SERVER = r"""
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
if os.getppid() == 1:
    sys.exit(0)
print(os.getpid(), flush=True)
sys.stdin.read()
"""

#: How long the server may take to start (a Python under the launcher, which registers it).
START_TIMEOUT_S = 30.0


class Server:
    """The server process under its launcher; :attr:`error` says why it is not up ("" if it
    is)."""

    def __init__(self, runtime: Path, workspace: Workspace, env: dict[str, str]) -> None:
        self.log = workspace.path / f"{SERVER_NAME}.log"
        self.pid: int | None = None
        self._buffer = b""
        command = [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", str(runtime)]
        command += ["--priority", "high", "--name", SERVER_NAME]
        command += ["--", sys.executable, "-c", SERVER]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=die_with_parent,
            )
        workspace.record(self.process.pid)
        # the launcher registers the command before it lets it run: its first line says both
        line = self._line(START_TIMEOUT_S)
        if line is not None and line.isdigit():
            self.pid = int(line)
            workspace.record(self.pid)  # it leads its own group, like the job
            self.error = ""
        else:
            self.error = self._why("the more important task did not start")

    def stop(self) -> None:
        """End the server (its stdin closes) and its launcher."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        stop_process(self.process)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def _line(self, timeout: float) -> str | None:
        """The server's next line on stdout; None at its end or after ``timeout``."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def _why(self, default: str) -> str:
        """``default``, with the last line the server or its launcher wrote, if any."""
        lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]
        return f"{default}: {lines[-1]}" if lines else default
