"""``gpreempt selftest``: which preemption mechanisms work on this machine, proven or not.

For each mechanism the self-test starts a private daemon and a job of its own with
``gpreempt run --mechanism M`` (:mod:`._selftest_probe`), holds it with ``gpreempt suspend``,
waits for what the job had queued to drain, checks that its progress then stood still,
releases it and checks that it goes on (:mod:`._selftest_hold`). On a GPU the progress is what
the GPU executed, counted by the job's own kernels in a page the self-test reads, with work
still queued: a mechanism "works" only if the GPU stopped (after the drain, which the rows
show), and ``kfd`` only if its tracer says it holds the task's queues. The gate's rows also
prove its stream barriers. The daemon has them put only while a more important task is
registered on the job's GPU, so the self-test registers one beside the job
(:mod:`._selftest_server`) and waits until the job has run what it had queued before, without
barriers; its daemon lets no gate sleep (an asleep driver-level gate puts none). A barrier row
"works" only if steps stayed queued on the GPU and it stopped within two steps of the
suspension. What cannot be shown on this machine (no GPU, no PyTorch, no AMD GPU for ``kfd``)
is "unproven", never "works". Exit code 0 when nothing failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..config import SOCKET_NAME
from ..names import MechanismName
from ._selftest_hold import barrier_row, hold_and_release, task, wait
from ._selftest_probe import JOB, PID, Counter, Workspace, die_with_parent, stop_process
from ._selftest_rows import FAILS, UNPROVEN, Machine, Row, report
from ._selftest_server import Server

#: The driver-level gate's row: the gate job without the in-process client (:func:`_job_command`),
#: so that only the driver-level gate (CUPTI, every launch) can hold it.
DRIVER_GATE = "driver-gate"
MECHANISMS = (
    MechanismName.GATE,
    MechanismName.LOCK,
    MechanismName.SIGNAL,
    MechanismName.KFD,
    DRIVER_GATE,
)
#: The rows whose job puts stream barriers, and the row that says whether they hold.
BARRIER_ROWS = {MechanismName.GATE: "barriers", DRIVER_GATE: "driver-barriers"}

#: How long a job may take to start (a first GPU run builds the gate's extension).
START_TIMEOUT_S = 180.0
#: How long the job may take to have run what it queued before its more important neighbour
#: registered (up to 64 steps: about 0.6 s on an H100): work queued without stream barriers.
TURNOVER_TIMEOUT_S = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "selftest",
        help="check which preemption mechanisms work on this machine",
        description=(
            "Start a small job of its own under each mechanism (gate, lock, signal, kfd), "
            "suspend it, check from the GPU's own progress that it stopped (once what it "
            "had queued drained) and resumed, and print what works, what fails, and what "
            "could not be proven here. The gate's rows also check its stream barriers, with a "
            "more important idle task registered beside the job. Uses a private daemon; exit "
            "code 0 when nothing failed."
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
            stop_process(daemon)
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
    # no gate sleeps: the server beside a gate row's job is never active, and an asleep gate's
    # barriers are its thread's, a millisecond apart; nor does its driver-level gate pace
    # (only where asked, and a trial starts only with a short queue: the job keeps 64 steps)
    command = [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime)]
    daemon = subprocess.Popen(
        [*command, "--sleep-after-s", "0"],
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


def _exercise(row: Row, runtime: Path, workspace: Workspace, mode: str) -> Row | None:
    """Run the job under ``row.mechanism``, suspend it, resume it, and fill in the row (and
    return its stream barriers' row, for the gate rows)."""
    name = f"selftest-{row.mechanism}"
    counter = workspace.counter(name)
    log_path = workspace.path / f"{name}.log"
    env = _env(runtime, row.mechanism)
    with open(log_path, "wb") as log:
        job = subprocess.Popen(
            _job_command(runtime, row.mechanism, name, env, [str(counter.path), mode]),
            env=env,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent,
        )
    workspace.record(job.pid)
    barriers = BARRIER_ROWS.get(row.mechanism)
    server: Server | None = None
    try:
        timeout = START_TIMEOUT_S if mode == "gpu" else 20.0
        if not wait(lambda: counter.executed > 0, job, timeout):
            row.verdict, row.note = FAILS, _why(log_path, "the job did not start")
            return None if barriers is None else barrier_row(barriers, row, "")
        workspace.record(counter.word(PID))  # the job (it leads its group)
        beside = ""
        if barriers is not None:
            server = Server(runtime, workspace, _env(runtime, "server"))
            beside = server.error or _turn_over(counter, job)
        hold_and_release(row, runtime, name, counter, job, mode)
        if row.mechanism == DRIVER_GATE:
            _check_driver_gate(row, runtime, name)
        if barriers is None:
            return None
        return barrier_row(barriers, row, beside or _slow_gate(log_path))
    finally:
        stop_process(job)
        if server is not None:
            server.stop()
        counter.close()


def _job_command(
    runtime: Path, mechanism: str, name: str, env: dict[str, str], args: list[str]
) -> list[str]:
    """``gpreempt run`` over the job. The driver-gate row's job runs without the in-process
    client (``PYTHONPATH`` as the launcher had it, without the client that ``gpreempt run``
    puts first): the driver-level gate then opens its own channel, as for any CUDA program,
    and nothing else can hold the job. With the client, PyTorch's operator hook would hold it
    too, or, with that hook off, the client's block would be the task's without a gate."""
    command = [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", str(runtime)]
    under = MechanismName.GATE if mechanism == DRIVER_GATE else mechanism
    command += ["--mechanism", under, "--priority", "low", "--name", name, "--"]
    if mechanism == DRIVER_GATE:
        command += [shutil.which("env") or "env", f"PYTHONPATH={env.get('PYTHONPATH', '')}"]
    return [*command, sys.executable, "-c", JOB, *args]


def _turn_over(counter: Counter, job: subprocess.Popen[bytes]) -> str:
    """Wait until the job has run every step it queued before it got its in-flight share
    (barriers go only into what is launched after): the GPU then finds a barrier between
    every two of its kernels. "" when done, else why not."""
    time.sleep(0.05)  # the daemon writes the share as it registers the task; the gate reads it
    queued = counter.launched
    if wait(lambda: counter.executed >= queued, job, TURNOVER_TIMEOUT_S):
        return ""
    return "what the job queued before its share (no barriers) did not run"


def _check_driver_gate(row: Row, runtime: Path, name: str) -> None:
    """A driver-gate row is about the driver-level gate only if it was on in the job (its job
    has no in-process client: nothing else could hold it)."""
    driver = (task(runtime, name).get("gate") or {}).get("driver")
    if driver == "failed":
        row.verdict, row.note = FAILS, "the driver-level gate failed in the job"
    elif driver != "on" and row.verdict != UNPROVEN:
        row.verdict, row.note = UNPROVEN, f"the driver-level gate was {driver}, not on"


def _slow_gate(log: Path) -> str:
    """The job's line saying that its gate is the Python one, which puts no stream barriers
    (its C++ part could not be built: the line says why); "" if it has none."""
    from ..client.gate.config import SLOW_GATE_NOTICE

    for line in log.read_text(errors="replace").splitlines():
        if SLOW_GATE_NOTICE in line:
            return line.strip()
    return ""


def _why(log: Path, default: str) -> str:
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return f"{default}: {lines[-1]}" if lines else default
