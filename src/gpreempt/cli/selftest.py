"""``gpreempt selftest``: which preemption mechanisms work on this machine, proven or not.

For each mechanism the self-test starts a private daemon and a job of its own with
``gpreempt run --mechanism M`` (:mod:`._selftest_probe`), holds it with ``gpreempt suspend``,
checks that its progress stood still, releases it and checks that it goes on. On a GPU the
progress is what the GPU executed, counted by the job's own kernels in a page the self-test
reads, with work still queued: a mechanism "works" only if the GPU stopped with that work
pending (or, for the launch gate and the driver lock, once what was in flight drained), and
``kfd`` only if its tracer says it holds the task's queues. What cannot be shown on this
machine (no GPU, no PyTorch, no AMD GPU for ``kfd``) is "unproven", never "works". Exit code 0
when nothing failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..config import SOCKET_NAME
from ..names import MechanismName
from ._selftest_probe import JOB, KIND, KIND_GPU, PID, Counter, Workspace, die_with_parent
from ._selftest_rows import FAILS, UNPROVEN, WORKS, Machine, Row, report

#: The driver-level gate's row: the gate job with PyTorch's operator hook off, so that only the
#: driver-level gate (CUPTI, every launch) can hold it.
DRIVER_GATE = "driver-gate"
MECHANISMS = (
    MechanismName.GATE,
    MechanismName.LOCK,
    MechanismName.SIGNAL,
    MechanismName.KFD,
    DRIVER_GATE,
)

#: How long a job may take to start (a first GPU run builds the gate's extension).
START_TIMEOUT_S = 180.0
#: How long after the suspension what was in flight may still finish, how long progress must
#: then stand still, and how soon it must come back.
SETTLE_S = 0.3
STILL_S = 1.0
RESUME_TIMEOUT_S = 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "selftest",
        help="check which preemption mechanisms work on this machine",
        description=(
            "Start a small job of its own under each mechanism (gate, lock, signal, kfd), "
            "suspend it, check from the GPU's own progress that it stopped and resumed, and "
            "print what works, what fails, and what could not be proven here. Uses a private "
            "daemon; exit code 0 when nothing failed."
        ),
    )
    parser.add_argument(
        "--mechanism",
        "-m",
        action="append",
        choices=MECHANISMS,
        metavar="NAME",
        help=f"test only this one, of {', '.join(MECHANISMS)} (repeatable; default: all)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    mechanisms = tuple(args.mechanism or MECHANISMS)
    machine = _machine()
    previous = {s: signal.signal(s, _terminate) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        rows = _run(mechanisms, machine)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    report(rows, machine, args.json)
    return 1 if any(r.verdict == FAILS for r in rows) else 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # the finally blocks stop the daemon and the jobs


def _machine() -> Machine:
    """What is here, found without importing PyTorch (seconds on a CPU machine)."""
    gpu = "nvidia" if Path("/dev/nvidiactl").exists() else ""
    gpu = gpu or ("amd" if Path("/dev/kfd").exists() else "")
    return Machine(gpu, importlib.util.find_spec("torch") is not None)


def _run(mechanisms: tuple[str, ...], machine: Machine) -> list[Row]:
    rows: list[Row] = []
    todo: list[tuple[Row, str]] = []
    for mechanism in mechanisms:
        row, mode = Row(mechanism), ""
        why = _why_unproven(mechanism, machine)
        if why:
            row.note = why
        else:
            mode = "gpu" if machine.gpu and machine.torch else "python"
            todo.append((row, mode))
        rows.append(row)
    if not todo:
        return rows
    workspace = Workspace()
    daemon: subprocess.Popen[bytes] | None = None
    try:
        runtime = workspace.path / "run"
        daemon = _start_daemon(runtime, workspace)
        for row, mode in todo:
            extra = _exercise(row, runtime, workspace, mode)
            if extra is not None:
                rows.insert(rows.index(row) + 1, extra)
    finally:
        if daemon is not None:
            _stop(daemon)
        workspace.close()
    return rows


def _why_unproven(mechanism: str, machine: Machine) -> str:
    """Why ``mechanism`` cannot be shown to work here ("" if it can be tried)."""
    if mechanism == MechanismName.SIGNAL:
        return ""  # a CPU job shows it where no GPU job can run
    if not machine.gpu:
        return {
            MechanismName.GATE: "no GPU: nothing to hold on a GPU",
            MechanismName.LOCK: "no NVIDIA GPU",
            MechanismName.KFD: "no AMD GPU (/dev/kfd absent)",
            DRIVER_GATE: "no NVIDIA GPU",
        }[mechanism]
    if not machine.torch:
        return "the GPU job needs PyTorch"
    if mechanism == DRIVER_GATE:
        from ..client.gate.driver_build import DriverGateUnavailable, build

        try:
            build()
        except DriverGateUnavailable as exc:
            return str(exc)
    if mechanism == MechanismName.LOCK:
        from ..mechanisms.cuda_driver import try_driver

        if try_driver() is None:
            return "no NVIDIA driver with the checkpoint API (r570+)"
    if mechanism == MechanismName.KFD:
        from ..errors import MechanismUnavailable
        from ..mechanisms.kfd_session import check_available

        try:
            check_available()
        except MechanismUnavailable as exc:
            return str(exc)
    return ""


def _env(runtime: Path, mechanism: str) -> dict[str, str]:
    from ..client.launcher import _env_with_package

    env = _env_with_package(os.environ.copy())
    env["GPREEMPT_RUNTIME_DIR"] = str(runtime)
    if mechanism == MechanismName.GATE:
        env.setdefault("GPREEMPT_GATE_BARRIER_MS", "1")  # stream barriers, to prove them too
    if mechanism == DRIVER_GATE:
        env["GPREEMPT_GATE"] = "0"  # no operator hook: only the driver-level gate holds it
    return env


def _start_daemon(runtime: Path, workspace: Workspace) -> subprocess.Popen[bytes]:
    runtime.mkdir(mode=0o700)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime)],
        env=_env(runtime, MechanismName.SIGNAL),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    workspace.record(daemon.pid)
    deadline = time.monotonic() + 20
    while not (runtime / SOCKET_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return daemon


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _exercise(row: Row, runtime: Path, workspace: Workspace, mode: str) -> Row | None:
    """Run the job under ``row.mechanism``, suspend it, resume it, and fill in the row (and
    return the stream barriers' row for the gate)."""
    name = f"selftest-{row.mechanism}"
    counter = workspace.counter(name)
    log_path = workspace.path / f"{name}.log"
    command = [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", str(runtime)]
    under = MechanismName.GATE if row.mechanism == DRIVER_GATE else row.mechanism
    command += ["--mechanism", under, "--priority", "low", "--name", name]
    command += ["--", sys.executable, "-c", JOB, str(counter.path), mode]
    with open(log_path, "wb") as log:
        job = subprocess.Popen(
            command,
            env=_env(runtime, row.mechanism),
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
    workspace.record(job.pid)
    try:
        timeout = START_TIMEOUT_S if mode == "gpu" else 20.0
        if not _wait(lambda: counter.executed > 0, job, timeout):
            row.verdict, row.note = FAILS, _why(log_path, "the job did not start")
            return None
        workspace.record(counter.word(PID))  # the job (it leads its group)
        return _hold_and_release(row, runtime, counter, job, mode)
    finally:
        _stop(job)
        counter.close()


def _hold_and_release(
    row: Row, runtime: Path, counter: Counter, job: subprocess.Popen[bytes], mode: str
) -> Row | None:
    name = f"selftest-{row.mechanism}"
    start = time.perf_counter()
    failed = _control(runtime, "suspend", name)
    row.suspend_ms = round((time.perf_counter() - start) * 1e3, 1)
    if failed is not None:
        row.verdict, row.note = FAILS, failed
        return None
    if row.mechanism == MechanismName.KFD:
        row.queues = _held_queues(counter.word(PID))
    time.sleep(SETTLE_S)
    executed, launched = counter.executed, counter.launched
    time.sleep(STILL_S)
    # signal stops the CPU side only: its proof is the launches; the others hold the GPU
    cpu_side = row.mechanism == MechanismName.SIGNAL
    row.stopped = (counter.launched if cpu_side else counter.executed) == (
        launched if cpu_side else executed
    )
    row.pending = counter.launched - counter.executed
    ran_on = counter.executed - executed
    failed = _control(runtime, "resume", name)
    if failed is not None:
        row.resumed, row.verdict, row.note = False, FAILS, failed
        return None
    after = counter.executed
    row.resumed = _wait(lambda: counter.executed > after, job, RESUME_TIMEOUT_S)
    gpu_counted = mode == "gpu" and counter.word(KIND) == KIND_GPU
    task = _task(runtime, name)
    _judge(row, gpu_counted, ran_on, task.get("last_mechanism"))
    driver = (task.get("gate") or {}).get("driver")
    if row.mechanism == DRIVER_GATE and row.verdict == WORKS and driver != "on":
        row.verdict, row.note = UNPROVEN, f"the driver-level gate was {driver}, not on"
    if row.mechanism == MechanismName.GATE:
        return _barrier_row(row, gpu_counted)
    return None


def _judge(row: Row, gpu_counted: bool, ran_on: int, used: str | None) -> None:
    if not row.stopped:
        row.verdict, row.note = FAILS, "the job kept making progress while suspended"
    elif not row.resumed:
        row.verdict, row.note = FAILS, "the job made no progress after resume"
    elif row.mechanism == MechanismName.SIGNAL:
        row.verdict = WORKS
        if gpu_counted and ran_on:
            row.note = f"the GPU ran on ({ran_on} queued steps) while the process stood still"
    elif not gpu_counted:
        row.note = "progress not read from GPU memory (no GPU, or its page could not be mapped)"
    elif row.mechanism == MechanismName.KFD and used != MechanismName.KFD:
        row.verdict, row.note = FAILS, f"the daemon fell back to {used}: see its 'degraded' event"
    elif row.mechanism == MechanismName.KFD and not row.queues:
        row.verdict, row.note = FAILS, "the tracer held none of the job's GPU queues"
    elif row.mechanism == MechanismName.KFD and not row.pending:
        row.note = "no GPU work was pending: held, but not shown to be held on the GPU"
    else:
        row.verdict = WORKS
        if row.mechanism == MechanismName.KFD:
            row.note = f"{row.queues} queues held with {row.pending} steps pending"


def _barrier_row(gate: Row, gpu_counted: bool) -> Row:
    """The gate's stream barriers: proven only by a kernel they held queued behind them."""
    row = Row("barriers", stopped=gate.stopped, resumed=gate.resumed, pending=gate.pending)
    if gate.verdict == FAILS:
        row.note = "the gate failed"
    elif not gpu_counted:
        row.note = gate.note
    elif gate.pending:
        row.verdict = WORKS
        row.note = f"{gate.pending} steps held queued behind a barrier"
    else:
        row.note = "no kernel was held queued behind a barrier (barriers off?)"
    return row


def _held_queues(pid: int) -> int | None:
    from ..errors import GpreemptError
    from ..mechanisms.kfd import request

    try:
        value = request(pid, "held").get("suspended")
    except GpreemptError:
        return None
    return value if isinstance(value, int) else None


def _task(runtime: Path, name: str) -> dict[str, Any]:
    """The task called ``name`` as ``gpreempt status --json`` shows it ({} if none)."""
    from ..client.api import status
    from ..errors import GpreemptError

    with contextlib.suppress(GpreemptError):
        for task in status(runtime_dir=runtime).get("tasks", []):
            if task.get("name") == name:
                return dict(task)
    return {}


def _wait(ready: Any, job: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        if job.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def _control(runtime: Path, verb: str, name: str) -> str | None:
    """``gpreempt suspend|resume NAME``; None on success, else the error line."""
    from ..client.api import resume, suspend
    from ..errors import GpreemptError

    try:
        (suspend if verb == "suspend" else resume)(name, runtime_dir=runtime)
    except GpreemptError as exc:
        return f"{verb} failed: {exc}"
    return None


def _why(log: Path, default: str) -> str:
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return f"{default}: {lines[-1]}" if lines else default
