"""Running one scenario: start its processes, wait until each has warmed up, send Case-A's
arrivals, stop everything, and collect what each process wrote.

Every process runs in its own session (process group) so that stopping it also stops what it
started; nothing is left running if a scenario fails or is interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GpreemptError, UsageError
from . import daemon_events
from .gpu_sampler import NvmlSampler
from .memory_pressure import MemoryPlan
from .mps import MpsDaemon

BASELINES = ("a-alone", "b-alone", "sequential", "time-sliced", "stream-priority")
MPS_SCENARIOS = ("mps", "mps-priority")
#: The gate with every process a client of a private MPS daemon, Case-B below normal.
GATE_MPS_SCENARIO = "gpreempt-gate-mps"
#: Scenarios run under a private MPS daemon -> Case-B's CUDA_MPS_CLIENT_PRIORITY, if any.
MPS_B_PRIORITY: dict[str, str | None] = {
    "mps": None,
    "mps-priority": "1",
    GATE_MPS_SCENARIO: "1",
}
#: Mechanisms forced with ``--mechanism`` (scenario ``gpreempt`` names none: the default).
MECHANISMS = ("signal", "lock", "gate")
#: ``gpreempt``: both tasks with nothing but their priority set, as users run them.
DEFAULT_SCENARIO = "gpreempt"
#: The same, with a server that never calls ``gpreempt.request()``.
NO_REQUEST_SCENARIO = "gpreempt-no-request"
GPREEMPT_SCENARIOS = (
    DEFAULT_SCENARIO,
    NO_REQUEST_SCENARIO,
    *(f"gpreempt-{m}" for m in MECHANISMS),
)
#: Case-A alone once more, after every other scenario: its distance from ``a-alone`` is the
#: drift of Case-A's own latency over the run (an eager server's moves a lot). Measured
#: whenever a scenario shares the GPU.
A_AFTER = "a-alone-after"
POLICY_SCENARIOS = ("gpreempt-timeslice", "gpreempt-share")
SCHEDULER_SCENARIO = "gpreempt-scheduler"
MEMORY_SCENARIOS = ("memory-pressure", "memory-pressure-baseline")
#: Run by default (``--quick`` stays within its time budget).
DEFAULT_SCENARIOS = BASELINES + MPS_SCENARIOS + GPREEMPT_SCENARIOS
#: Only when named in ``--scenarios`` (or ``--scenarios all``).
OPT_IN_SCENARIOS = (
    *POLICY_SCENARIOS,
    GATE_MPS_SCENARIO,
    SCHEDULER_SCENARIO,
    *MEMORY_SCENARIOS,
)
ALL_SCENARIOS = DEFAULT_SCENARIOS + OPT_IN_SCENARIOS + (A_AFTER,)
#: Case-B's guaranteed share in gpreempt-share (``gpreempt run --min-share``).
SHARE_MIN = 0.2

DESCRIPTIONS = {
    "a-alone": "Case-A alone (the reference for latency ratios)",
    "b-alone": "Case-B alone (the reference for B kept)",
    "sequential": "Case-A, then Case-B: no sharing (from a-alone and b-alone)",
    "time-sliced": "separate processes, default time slicing",
    "stream-priority": "one process: Case-A on a high-priority stream, Case-B in a thread",
    "mps": "separate processes under MPS",
    "mps-priority": "MPS with CUDA_MPS_CLIENT_PRIORITY=1 for Case-B",
    DEFAULT_SCENARIO: "gpreempt with its defaults: only --priority high / low",
    NO_REQUEST_SCENARIO: "gpreempt with its defaults, Case-A never calls gpreempt.request()",
    **{f"gpreempt-{m}": f"gpreempt, Case-B forced to --mechanism {m}" for m in MECHANISMS},
    A_AFTER: "Case-A alone again, after every other scenario (its drift over the run)",
    GATE_MPS_SCENARIO: "gpreempt, mechanism gate, all processes under MPS, Case-B below normal",
    "gpreempt-timeslice": "gpreempt, policy timeslice (slices 80 ms high / 20 ms low)",
    "gpreempt-share": f"gpreempt, policy share, Case-B --min-share {SHARE_MIN}",
    "gpreempt-scheduler": "one process: gpreempt.GPUScheduler, Case-A high, Case-B low",
    "memory-pressure": "gpreempt: Case-A grows beyond free memory, Case-B is evicted",
    "memory-pressure-baseline": "no gpreempt: Case-A grows beyond free memory",
}


@dataclass(frozen=True)
class DaemonSetup:
    """How a scenario with a private daemon starts it and its tasks."""

    policy: str = "hpf"
    b_mechanism: str | None = None  # None: the default (no --mechanism)
    b_options: tuple[str, ...] = ()
    a_request: bool = True  # Case-A marks its requests with gpreempt.request()


DAEMON_SETUPS: dict[str, DaemonSetup] = {
    DEFAULT_SCENARIO: DaemonSetup(),
    NO_REQUEST_SCENARIO: DaemonSetup(a_request=False),
    **{f"gpreempt-{m}": DaemonSetup(b_mechanism=m) for m in MECHANISMS},
    GATE_MPS_SCENARIO: DaemonSetup(b_mechanism="gate"),
    "gpreempt-timeslice": DaemonSetup(policy="timeslice"),
    "gpreempt-share": DaemonSetup(policy="share", b_options=("--min-share", str(SHARE_MIN))),
    "memory-pressure": DaemonSetup(),
}


class ScenarioFailed(GpreemptError):
    """A scenario could not be measured; the message says why (it becomes the invalid reason)."""


def check_scenarios(names: Sequence[str]) -> tuple[str, ...]:
    """Validate scenario names (UsageError listing the known ones)."""
    unknown = [n for n in names if n not in ALL_SCENARIOS]
    if unknown:
        raise UsageError(
            f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(ALL_SCENARIOS)}"
        )
    return tuple(dict.fromkeys(names))


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

    def calibrate_argv(self, out: Path, count: int) -> list[str]:
        argv = [*self._module(), "serve", "--batch", str(self.case_a_batch)]
        argv += ["--warmup-s", str(self.warmup_s), "--calibrate", str(count), "--out", str(out)]
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


@dataclass
class RawScenario:
    """What one scenario's processes recorded, before any statistics."""

    name: str
    directory: Path
    serve: dict[str, Any] | None = None  # Case-A's results (scheduled/start/end unix times)
    trains: list[dict[str, Any]] = field(default_factory=list)  # each Case-B's results
    window: tuple[float, float] | None = None  # measured window (unix times)
    events: list[dict[str, Any]] = field(default_factory=list)  # daemon events
    valid: bool = True
    reason: str | None = None
    gpu: dict[str, Any] | str = "n/a"
    roles: dict[int, str] = field(default_factory=dict)
    # memory scenarios: the plan, Case-B's exit codes, when its restore came, notes
    memory: dict[str, Any] = field(default_factory=dict)

    def invalidate(self, reason: str) -> None:
        self.valid = False
        self.reason = f"{self.reason}; {reason}" if self.reason else reason


@dataclass(frozen=True)
class Harness:
    """Everything a scenario needs that is the same for the whole run."""

    workloads: Workloads
    arrivals_file: Path  # JSON list of arrival offsets (s)
    planned_span_s: float  # last arrival offset: how long Case-A's arrivals last
    bg: int = 1
    gpreempt: tuple[str, ...] = (sys.executable, "-m", "gpreempt")
    mps_control: str = "nvidia-cuda-mps-control"
    ready_timeout_s: float = 300.0
    nvml: bool = True
    gpu_index: int = 0
    memory: MemoryPlan | None = None  # the memory scenarios' plan (None: none asked for)
    serve_args: tuple[str, ...] = ()  # extra options for every private daemon


def _files(directory: Path, name: str) -> dict[str, Path]:
    return {
        "ready": directory / f"{name}.ready",
        "go": directory / "go.json",
        "stop": directory / f"{name}.stop",
        "out": directory / f"{name}.json",
        "steps": directory / f"{name}.steps",
        "arrivals": directory / "arrivals.json",
    }


def _wait_ready(children: Sequence[Child], timeout_s: float, user_cmd_grace: float) -> None:
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


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _user_steps(path: Path) -> list[float] | None:
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


class _Daemon:
    """A private ``gpreempt serve`` in a short temporary runtime directory."""

    def __init__(self, harness: Harness, directory: Path) -> None:
        self.harness = harness
        self.directory = directory
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="gpb-"))
        self.child: Child | None = None

    def start(self, env: dict[str, str], policy: str = "hpf") -> None:
        argv = [*self.harness.gpreempt, "serve", "--runtime-dir", str(self.runtime_dir)]
        argv += ["--policy", policy, *self.harness.serve_args]
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
        wrapped = [*self.harness.gpreempt, "run", "--runtime-dir", str(self.runtime_dir)]
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


def run_scenario(harness: Harness, name: str, directory: Path, b_alone_s: float) -> RawScenario:
    """Run scenario ``name`` once in ``directory``; failures become an invalid RawScenario."""
    directory.mkdir(parents=True, exist_ok=True)
    raw = RawScenario(name, directory)
    try:
        _run(harness, name, raw, b_alone_s)
    except ScenarioFailed as exc:
        raw.invalidate(str(exc))
    except GpreemptError as exc:
        raw.invalidate(f"{type(exc).__name__}: {exc}")
    (directory / "scenario.json").write_text(
        json.dumps({"name": name, "valid": raw.valid, "reason": raw.reason}, indent=1)
    )
    return raw


def _memory_plan(harness: Harness, name: str) -> MemoryPlan:
    """The plan of a memory scenario, or ScenarioFailed saying why it cannot run here."""
    plan = harness.memory
    if plan is None:
        raise ScenarioFailed("no memory plan: GPU 0's free memory was not measured")
    if plan.problem:
        raise ScenarioFailed(plan.problem)
    if name == "memory-pressure" and plan.checkpoint_problem:
        raise ScenarioFailed(plan.checkpoint_problem)
    if harness.workloads.case_b_cmd:
        raise ScenarioFailed(
            f"{name} needs Case-B in Python (built in or --case-b-fn) to hold the ballast, "
            "not a command"
        )
    return plan


def _run(harness: Harness, name: str, raw: RawScenario, b_alone_s: float) -> None:
    work, directory = harness.workloads, raw.directory
    with_a = name != "b-alone"
    b_count = 0 if name in ("a-alone", A_AFTER) else harness.bg
    setup = DAEMON_SETUPS.get(name)
    one_process = {"stream-priority": "combined", SCHEDULER_SCENARIO: "scheduled"}.get(name)
    plan = _memory_plan(harness, name) if name in MEMORY_SCENARIOS else None
    if plan is not None:
        raw.memory["plan"] = plan.as_dict()
    children: list[Child] = []
    daemon: _Daemon | None = None
    mps: MpsDaemon | None = None
    sampler = NvmlSampler(harness.gpu_index) if harness.nvml else None
    try:
        env_a, env_b = work.environment(), work.environment()
        if name in MPS_B_PRIORITY:
            # private pipe/log directories in the run's directory, unless its path is too long
            # for the unix sockets MPS makes there
            mps_dir = harness.arrivals_file.parent / "mps"
            if len(str(mps_dir)) > 80:
                mps_dir = Path(tempfile.mkdtemp(prefix="gpb-mps-"))
            mps = MpsDaemon(mps_dir, harness.mps_control)
            try:
                mps.start()
            except GpreemptError as exc:
                raise ScenarioFailed(str(exc)) from None
            env_a = work.environment(mps.env())
            b_priority = MPS_B_PRIORITY[name]
            env_b = work.environment(
                {
                    **mps.env(),
                    **({"CUDA_MPS_CLIENT_PRIORITY": b_priority} if b_priority else {}),
                }
            )
        if setup:
            daemon = _Daemon(harness, directory)
            daemon.start(work.environment(), setup.policy)

        a_files = _files(directory, "case-a")
        if with_a:
            shutil.copy(harness.arrivals_file, a_files["arrivals"])
            a_files["go"].unlink(missing_ok=True)
        b_files = [_files(directory, f"case-b-{i}") for i in range(b_count)]

        if one_process:
            argv = work.combined_argv(a_files, b_files[0], one_process)
            children.append(Child.start("case-a-b", argv, env_a, directory, a_files))
        else:
            for i, files in enumerate(b_files):
                ballast = plan.ballast_bytes if plan is not None and i == 0 else 0
                argv = work.train_argv(files, ballast)
                if work.case_b_cmd:
                    files["user_cmd"] = files["steps"]
                    env = {
                        **env_b,
                        "GPREEMPT_BENCH_READY_FILE": str(files["ready"]),
                        "GPREEMPT_BENCH_STOP_FILE": str(files["stop"]),
                        "GPREEMPT_BENCH_STEPS_FILE": str(files["steps"]),
                    }
                else:
                    env = env_b
                if daemon and setup:
                    argv = daemon.wrap(
                        argv, f"case-b-{i}", "low", setup.b_mechanism, setup.b_options
                    )
                children.append(Child.start(f"case-b-{i}", argv, env, directory, files))
            if with_a:
                growth: list[str] = []
                if plan is not None:  # the baseline has nothing to wait for: it fails at once
                    growth = work.growth_options(plan, plan.wait_s if daemon else 0.0)
                argv = work.serve_argv(a_files, growth, setup.a_request if setup else True)
                if daemon:
                    reserve = ["--reserve-memory", plan.reserve_option()] if plan else []
                    argv = daemon.wrap(argv, "case-a", "high", None, reserve)
                children.append(Child.start("case-a", argv, env_a, directory, a_files))

        _wait_ready(children, harness.ready_timeout_s, work.warmup_s * 3)
        if sampler:
            sampler.start()
        t0 = time.time() + 0.1
        if with_a:
            from .loops import write_json

            write_json(a_files["go"], {"t0": t0})
            server = children[-1]
            limit = 120 + 30 * harness.planned_span_s + (plan.wait_s if plan else 0.0)
            try:
                server.popen.wait(limit)
            except subprocess.TimeoutExpired:
                raise ScenarioFailed(f"Case-A did not finish within {limit:.0f} s") from None
            a_end = time.time()
            if server.popen.returncode != 0:
                raise server.failure("failed")
            for child in children[:-1]:
                if not child.alive():
                    raw.invalidate(
                        f"{child.name} exited (code {child.popen.returncode}) before Case-A "
                        "finished: the processes did not overlap for the whole window"
                    )
            raw.serve = _read_json(a_files["out"])
            if raw.serve is None or not raw.serve.get("end"):
                raise ScenarioFailed(f"Case-A wrote no results to {a_files['out'].name}")
            raw.window = (min(raw.serve["scheduled"]), max(raw.serve["end"]))
            if raw.window[1] > a_end + 1:
                raw.invalidate("Case-A's clock disagrees with the harness's")
        else:
            time.sleep(max(0.0, t0 - time.time()) + b_alone_s)
            raw.window = (t0, t0 + b_alone_s)
        if sampler:
            sampler.stop()
        if plan is not None:
            _after_growth(raw, plan, daemon)

        for child in children:
            if child.name.startswith("case-b"):
                child.files["stop"].touch()
        for child in children:
            if "user_cmd" in child.files:  # a user's command is stopped with SIGTERM
                child.stop()
                continue
            try:
                child.popen.wait(30)
            except subprocess.TimeoutExpired:
                child.stop()
        if plan is not None:
            raw.memory["b_exit_codes"] = [
                c.popen.returncode for c in children if c.name.startswith("case-b")
            ]
        for i, files in enumerate(b_files):
            if one_process:
                data = _read_json(files["out"])
            elif work.case_b_cmd:
                data = {"step_end_t": _user_steps(files["steps"])}
            else:
                data = _read_json(files["out"])
            if data is None:
                raw.invalidate(f"case-b-{i} wrote no results")
                data = {"step_end_t": []}
            raw.trains.append(data)
        raw.roles = _roles(raw)
    finally:
        if sampler:
            sampler.stop()
        for child in reversed(children):
            child.stop()
        if daemon is not None:
            raw.events = daemon.stop()
        if mps is not None:
            mps.stop()
        if sampler:
            raw.gpu = sampler.summary(raw.roles)


def _after_growth(raw: RawScenario, plan: MemoryPlan, daemon: _Daemon | None) -> None:
    """After Case-A's window in a memory scenario: check the growth really met a full GPU,
    wait for Case-B's restore (under gpreempt), then let Case-B run ``settle_s`` more so that
    its progress after the restore shows."""
    growth = (raw.serve or {}).get("growth")
    if not growth:
        raw.invalidate("Case-A recorded no working-set growth")
    elif growth.get("free_before_bytes", 0) >= growth.get("asked_bytes", 0):
        raw.invalidate(
            f"Case-A's growth ({growth['asked_bytes'] / 2**30:.1f} GiB) fitted in the "
            f"{growth['free_before_bytes'] / 2**30:.1f} GiB free: there was no memory pressure; "
            "raise --growth-gib or --ballast-gib"
        )
    progress_from = raw.window[1] if raw.window else time.time()
    if daemon is not None:
        evicted = False
        deadline = time.monotonic() + plan.restore_timeout_s
        while True:
            events = [e for e in daemon.events() if str(e.get("task", "")).startswith("case-b")]
            evicted = any(e.get("event") == "evict" for e in events)
            restores = [e["t"] for e in events if e.get("event") == "restore" and "t" in e]
            if not evicted or restores or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if restores:
            raw.memory["restore_t"] = progress_from = max(restores)
        elif evicted:
            raw.memory.setdefault("notes", []).append(
                f"Case-B was not restored within {plan.restore_timeout_s:.0f} s after Case-A's "
                "window"
            )
        if growth and events:
            early = [
                e
                for e in events
                if e.get("event") == "evict" and e.get("t", float("inf")) < growth["start_t"]
            ]
            if early:
                raw.memory.setdefault("notes", []).append(
                    "Case-B was evicted before Case-A's growth (its reserve was not free at "
                    "start): the growth request did not wait for the eviction"
                )
    raw.memory["progress_from_t"] = progress_from
    time.sleep(plan.settle_s)


def _roles(raw: RawScenario) -> dict[int, str]:
    roles = {}
    if raw.serve and isinstance(raw.serve.get("pid"), int):
        roles[raw.serve["pid"]] = "case-a"
    for i, data in enumerate(raw.trains):
        if isinstance(data.get("pid"), int):
            roles.setdefault(data["pid"], f"case-b-{i}")
    return roles


def calibrate(harness: Harness, directory: Path, count: int) -> list[float]:
    """Case-A's service times (ms) alone, ``count`` isolated requests, for the arrival rate."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "calibration.json"
    child = Child.start(
        "calibrate",
        harness.workloads.calibrate_argv(out, count),
        harness.workloads.environment(),
        directory,
    )
    try:
        child.popen.wait(harness.ready_timeout_s)
    except subprocess.TimeoutExpired:
        child.stop()
        raise ScenarioFailed(f"calibration took over {harness.ready_timeout_s:.0f} s") from None
    finally:
        child.stop()
    data = _read_json(out)
    if child.popen.returncode != 0 or not data or not data.get("service_ms"):
        raise child.failure("could not measure Case-A's service time")
    return [float(x) for x in data["service_ms"]]
