"""A private MPS control daemon for the MPS scenarios, always stopped again.

Started with ``nvidia-cuda-mps-control -d`` and its pipe and log directories inside the run's
output directory, so it serves only the benchmark's processes (those given :meth:`env`) and
leaves any other MPS setup on the machine alone. Stopped with ``echo quit |
nvidia-cuda-mps-control`` under the same environment: on leaving the ``with`` block, on an
error or Ctrl-C, and at interpreter exit as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from ..errors import GpreemptError

CONTROL = "nvidia-cuda-mps-control"


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

    def __enter__(self) -> MpsDaemon:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
