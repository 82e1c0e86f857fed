"""A private MPS control daemon for the MPS scenarios, always stopped again.

Started with ``nvidia-cuda-mps-control -d`` and its pipe and log directories inside the run's
output directory, so it serves only the benchmark's processes (those given :meth:`env`) and
leaves any other MPS setup on the machine alone. Stopped with ``echo quit |
nvidia-cuda-mps-control`` under the same environment: on leaving the ``with`` block, on an
error or Ctrl-C, and at interpreter exit as a last resort. A quit does not always end it (one
sent while a client was still attached left the daemon and its server running), so the stop
is checked: MPS's processes that serve this pipe directory and are still there a few seconds
later are terminated, then killed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import GpreemptError

CONTROL = "nvidia-cuda-mps-control"
#: The control daemon's and its servers' name as the kernel keeps it (15 bytes of it).
PROCESS_NAME = "nvidia-cuda-mps"
#: How long a quit may take before the daemon's processes are terminated, then killed (s).
QUIT_S, TERM_S = 5.0, 2.0


class MpsUnavailable(GpreemptError):
    """MPS cannot be started here (no control binary, or it refused to start)."""


class MpsDaemon:
    """``with MpsDaemon(dir) as mps: Popen(..., env={**os.environ, **mps.env()})``."""

    def __init__(self, directory: Path, control: str = CONTROL) -> None:
        self.pipe_dir = directory / "mps-pipe"
        self.log_dir = directory / "mps-log"
        self.control = control
        self.running = False

    def env(self) -> dict[str, str]:
        """The variables that make a CUDA process a client of this daemon."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def _control_env(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    def start(self) -> None:
        binary = shutil.which(self.control)
        if binary is None:
            raise MpsUnavailable(
                f"{self.control} not found on PATH: MPS scenarios need the NVIDIA driver's "
                "MPS tools; leave the MPS scenarios (mps, mps-priority, gpreempt-gate-mps) "
                "out of --scenarios"
            )
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        result = subprocess.run(
            [binary, "-d"], env=self._control_env(), capture_output=True, text=True, timeout=30
        )
        if result.returncode != 0:
            raise MpsUnavailable(
                f"`{self.control} -d` failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}"
            )
        self.running = True
        time.sleep(0.2)  # the control daemon forks; give it time to open its pipe

    def stop(self) -> None:
        """Ask the control daemon to quit (it stops its server too); safe to call twice."""
        if not self.running:
            return
        self.running = False
        binary = shutil.which(self.control) or self.control
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [binary],
                input="quit\n",
                env=self._control_env(),
                capture_output=True,
                text=True,
                timeout=30,
            )
        time.sleep(0.5)  # let the server exit before the next scenario's clients start
        for how, within in ((None, QUIT_S), (signal.SIGTERM, TERM_S), (signal.SIGKILL, TERM_S)):
            left = self.processes()
            for pid in left if how is not None else ():
                with contextlib.suppress(OSError):
                    os.kill(pid, how)
            if not left or _gone(self.processes, within):
                return

    def processes(self) -> list[int]:
        """MPS's processes (the control daemon, its servers) that serve this daemon's pipe
        directory: so named, with it in their environment. Clients are not among them."""
        mark = f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() != PROCESS_NAME:
                    continue
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone, or another user's
                continue
        return found

    def __enter__(self) -> MpsDaemon:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _gone(processes: Callable[[], list[int]], within_s: float) -> bool:
    """Whether ``processes()`` comes back empty within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
