"""Running one scenario: start its processes, wait until each has warmed up, send Case-A's
arrivals, stop everything, and collect what each process wrote.

Every process runs in its own session (process group) so that stopping it also stops what it
started; nothing is left running if a scenario fails or is interrupted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GpreemptError
from .child_process import Child, read_json, user_steps, wait_ready
from .gpu_sampler import NvmlSampler
from .memory_pressure import MemoryPlan
from .mps import MpsDaemon
from .private_daemon import PrivateDaemon
from .scenario_catalog import (
    CASE_A_ONLY,
    DAEMON_SETUPS,
    MEMORY_SCENARIOS,
    MPS_B_PRIORITY,
    SCHEDULER_SCENARIO,
    ScenarioFailed,
)
from .workload_argv import Workloads


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
    b_count = 0 if name in CASE_A_ONLY else harness.bg
    setup = DAEMON_SETUPS.get(name)
    one_process = {"stream-priority": "combined", SCHEDULER_SCENARIO: "scheduled"}.get(name)
    plan = _memory_plan(harness, name) if name in MEMORY_SCENARIOS else None
    if plan is not None:
        raw.memory["plan"] = plan.as_dict()
    children: list[Child] = []
    daemon: PrivateDaemon | None = None
    mps: MpsDaemon | None = None
    sampler = NvmlSampler(harness.gpu_index) if harness.nvml else None
    try:
        env_a, env_b = work.environment(dict(work.env_a)), work.environment(dict(work.env_b))
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
            env_a = work.environment({**dict(work.env_a), **mps.env()})
            b_priority = MPS_B_PRIORITY[name]
            env_b = work.environment(
                {
                    **dict(work.env_b),
                    **mps.env(),
                    **({"CUDA_MPS_CLIENT_PRIORITY": b_priority} if b_priority else {}),
                }
            )
        if setup:
            daemon = PrivateDaemon(harness.gpreempt, harness.serve_args, directory)
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

        wait_ready(children, harness.ready_timeout_s, work.warmup_s * 3)
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
            raw.serve = read_json(a_files["out"])
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
                data = read_json(files["out"])
            elif work.case_b_cmd:
                data = {"step_end_t": user_steps(files["steps"])}
            else:
                data = read_json(files["out"])
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


def _after_growth(raw: RawScenario, plan: MemoryPlan, daemon: PrivateDaemon | None) -> None:
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


def calibrate(harness: Harness, directory: Path, count: int, load: float = 0.0) -> list[float]:
    """Case-A's service times (ms) alone, for the arrival rate: of ``count`` isolated requests,
    or with ``load``, of ``count`` requests served open loop at that load."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "calibration.json"
    child = Child.start(
        "calibrate",
        harness.workloads.calibrate_argv(out, count, load),
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
    data = read_json(out)
    if child.popen.returncode != 0 or not data or not data.get("service_ms"):
        raise child.failure("could not measure Case-A's service time")
    return [float(x) for x in data["service_ms"]]
