"""The command lines of a scenario's Case-A and Case-B processes (:class:`Workloads`).

The processes themselves are :mod:`.workloads` (``python -m gpreempt.bench.workloads``), or a
user's command as Case-B; this module only says how to start them.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .memory_pressure import MemoryPlan
from .scenario_catalog import SCHEDULER_SCENARIO, ScenarioFailed


@dataclass(frozen=True)
class Workloads:
    """How to start Case-A and Case-B processes."""

    python: str = sys.executable
    case_a_batch: int = 8  # ResNet-50 batch of the built-in Case-A
    case_a_graph: bool = True  # the built-in Case-A replays a CUDA graph (else eager)
    case_b_kind: str = "transformer"  # the built-in Case-B (workloads.CASE_B_KINDS)
    case_a_fn: str | None = None  # MODULE:FACTORY of a user's request handler
    case_b_fn: str | None = None  # MODULE:FACTORY of a user's training step
    case_b_cmd: str | None = None  # any command as Case-B (shell words)
    memory_fn: str | None = None  # MODULE:FACTORY of device memory (memory scenarios; torch's)
    warmup_s: float = 2.0  # each process warms up at least this long
    warmup_steps: int = 10
    env: tuple[tuple[str, str], ...] = ()  # extra environment for every process
    env_a: tuple[tuple[str, str], ...] = ()  # and for Case-A's processes only
    env_b: tuple[tuple[str, str], ...] = ()  # and for Case-B's processes only

    def _module(self) -> list[str]:
        return [self.python, "-m", "gpreempt.bench.workloads"]

    def serve_options(self, files: dict[str, Path]) -> list[str]:
        argv = ["--batch", str(self.case_a_batch), "--warmup-s", str(self.warmup_s)]
        if self.case_a_fn:
            argv += ["--fn", self.case_a_fn]
        elif not self.case_a_graph:
            argv += ["--eager"]
        return argv + [
            "--ready-file",
            str(files["ready"]),
            "--go-file",
            str(files["go"]),
            "--arrivals",
            str(files["arrivals"]),
            "--out",
            str(files["out"]),
        ]

    def serve_argv(
        self, files: dict[str, Path], growth: Sequence[str] = (), request: bool = True
    ) -> list[str]:
        """Case-A; ``growth`` adds the memory-pressure options (see :meth:`growth_options`);
        ``request=False``: it never calls gpreempt.request()."""
        hint = [] if request else ["--no-request"]
        return [*self._module(), "serve", *self.serve_options(files), *growth, *hint]

    def growth_options(self, plan: MemoryPlan, wait_s: float) -> list[str]:
        argv = ["--grow-bytes", str(plan.growth_bytes), "--grow-at-s", str(plan.growth_at_s)]
        argv += ["--grow-chunk-bytes", str(plan.chunk_bytes), "--grow-wait-s", str(wait_s)]
        return argv + (["--memory-fn", self.memory_fn] if self.memory_fn else [])

    def calibrate_argv(self, out: Path, count: int, load: float = 0.0) -> list[str]:
        argv = [*self._module(), "serve", "--batch", str(self.case_a_batch)]
        argv += ["--warmup-s", str(self.warmup_s), "--calibrate", str(count), "--out", str(out)]
        if load:
            argv += ["--calibrate-load", str(load)]
        if self.case_a_fn:
            return argv + ["--fn", self.case_a_fn]
        return argv + ([] if self.case_a_graph else ["--eager"])

    def train_argv(self, files: dict[str, Path], ballast_bytes: int = 0) -> list[str]:
        if self.case_b_cmd:
            return shlex.split(self.case_b_cmd)
        argv = [*self._module(), "train", "--warmup-s", str(self.warmup_s)]
        argv += ["--warmup-steps", str(self.warmup_steps)]
        if self.case_b_fn:
            argv += ["--fn", self.case_b_fn]
        elif self.case_b_kind != "transformer":
            argv += ["--kind", self.case_b_kind]
        if ballast_bytes:
            argv += ["--ballast-bytes", str(ballast_bytes)]
            argv += ["--memory-fn", self.memory_fn] if self.memory_fn else []
        return argv + [
            "--ready-file",
            str(files["ready"]),
            "--stop-file",
            str(files["stop"]),
            "--out",
            str(files["out"]),
        ]

    def combined_argv(
        self, a_files: dict[str, Path], b_files: dict[str, Path], role: str = "combined"
    ) -> list[str]:
        """Case-A and Case-B in one process: ``combined`` (stream priority) or ``scheduled``
        (gpreempt.GPUScheduler)."""
        if self.case_b_cmd:
            scenario = "stream-priority" if role == "combined" else SCHEDULER_SCENARIO
            raise ScenarioFailed(
                f"{scenario} needs Case-B in Python (built in or --case-b-fn), not a command"
            )
        argv = [*self._module(), role, *self.serve_options(a_files)]
        argv += ["--warmup-steps", str(self.warmup_steps), "--train-out", str(b_files["out"])]
        return argv + (["--train-fn", self.case_b_fn] if self.case_b_fn else [])

    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", **dict(self.env), **(extra or {})}
