"""``gpreempt selftest``: which preemption mechanisms work on this machine, checked for real.

For each mechanism (gate, lock, signal, kfd) the self-test first asks whether it can exist
here (PyTorch and the gate's extension; the NVIDIA driver's checkpoint API; ``/dev/kfd`` with
the debugger API). For each one that can, it starts a private daemon and a small job of its own
with ``gpreempt run --mechanism M`` (GPU work on the first GPU where there is one, CPU work
otherwise), holds it with ``gpreempt suspend``, checks that its progress stopped, releases it,
and checks that it goes on. The job is the whole path a user's task takes, so a row that says
"works" means the mechanism preempted a process on this machine. Exit code 0 when every
mechanism that exists here works.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import SOCKET_NAME
from ..names import MechanismName

MECHANISMS = (MechanismName.GATE, MechanismName.LOCK, MechanismName.SIGNAL, MechanismName.KFD)

#: The job: counts steps of work into a file (GPU work waits for the GPU at each step, so a
#: step counts only once the GPU did it).
JOB = """
import os, sys, time
path, mode = sys.argv[1], sys.argv[2]
if mode == "python":
    def step():
        sum(range(20000))
else:
    import torch
    device = "cuda" if mode == "gpu" else "cpu"
    x = torch.randn(512, 512, device=device)
    def step():
        y = x
        for _ in range(4):
            y = torch.tanh(y @ x)
        if device == "cuda":
            torch.cuda.synchronize()
n = 0
while True:
    step()
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(path + ".tmp", path)
    time.sleep(0.002)
"""

#: How long a job may take to start (a first run builds the gate's extension).
START_TIMEOUT_S = 180.0
#: How long progress must stand still to count as stopped, and how soon it must come back.
STILL_S = 1.0
RESUME_TIMEOUT_S = 10.0


@dataclass
class Row:
    mechanism: str
    exists: bool
    stopped: bool | None = None
    resumed: bool | None = None
    suspend_ms: float | None = None
    note: str = ""

    @property
    def works(self) -> bool:
        return bool(self.exists and self.stopped and self.resumed)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "selftest",
        help="check which preemption mechanisms work on this machine",
        description=(
            "Start a small job of its own under each mechanism that exists here (gate, lock, "
            "signal, kfd), suspend it, check that it stopped making progress and that it "
            "resumed, and print what works, what does not, and why. Uses a private daemon; "
            "exit code 0 when every mechanism that exists here works."
        ),
    )
    parser.add_argument(
        "--mechanism",
        "-m",
        action="append",
        choices=MECHANISMS,
        help="test only this mechanism (repeatable; default: all)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    mechanisms = tuple(args.mechanism or MECHANISMS)
    mode, where = _job_mode()
    rows = [_exists(m, mode) for m in mechanisms]
    if any(r.exists for r in rows):
        with tempfile.TemporaryDirectory(prefix="gpreempt-selftest-") as tmp:
            runtime = Path(tmp) / "run"
            daemon = _start_daemon(runtime)
            try:
                for row in rows:
                    if row.exists:
                        _exercise(row, runtime, Path(tmp), mode)
            finally:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
    _report(rows, where, args.json)
    return 0 if all(r.works for r in rows if r.exists) else 1


def _job_mode() -> tuple[str, str]:
    """What the job runs: GPU work where PyTorch sees a GPU, else CPU tensors, else Python."""
    try:
        import torch
    except ImportError:
        return "python", "no PyTorch: a Python job on the CPU"
    if torch.cuda.is_available():
        kind = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        return "gpu", f"{torch.cuda.get_device_name(0)} ({kind}, PyTorch {torch.__version__})"
    return "cpu", f"no GPU: CPU tensors (PyTorch {torch.__version__})"


def _exists(mechanism: str, mode: str) -> Row:
    from ..errors import MechanismUnavailable

    row = Row(mechanism, exists=True)
    if mechanism == MechanismName.GATE:
        if mode == "python":
            row.exists, row.note = False, "needs PyTorch"
            return row
        from ..client.gate.build import NativeGateUnavailable, load_native

        try:
            load_native()
        except NativeGateUnavailable as exc:
            row.note = f"the C++ gate cannot be built ({exc}); the Python fallback is used"
        if mode == "cpu":
            row.note = "CPU tensors: launches stop, no GPU work to drain"
    elif mechanism == MechanismName.LOCK:
        from ..mechanisms.cuda_driver import try_driver

        if try_driver() is None:
            row.exists, row.note = False, "no NVIDIA driver with the checkpoint API (r570+)"
    elif mechanism == MechanismName.KFD:
        from ..mechanisms.kfd_session import check_available

        try:
            check_available()
        except MechanismUnavailable as exc:
            row.exists, row.note = False, str(exc)
        else:
            if mode != "gpu":
                row.exists, row.note = False, "PyTorch sees no GPU to run a job on"
    elif mechanism == MechanismName.SIGNAL and mode == "gpu":
        row.note = "stops the CPU side; GPU work already queued still drains"
    return row


def _env(runtime: Path) -> dict[str, str]:
    from ..client.launcher import _env_with_package

    env = _env_with_package(os.environ.copy())
    env["GPREEMPT_RUNTIME_DIR"] = str(runtime)
    return env


def _start_daemon(runtime: Path) -> subprocess.Popen[bytes]:
    runtime.mkdir(mode=0o700)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpreempt", "serve", "--runtime-dir", str(runtime)],
        env=_env(runtime),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not (runtime / SOCKET_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return daemon


def _exercise(row: Row, runtime: Path, tmp: Path, mode: str) -> None:
    """Run the job under ``row.mechanism``, suspend it, resume it, and fill in the row."""
    name = f"selftest-{row.mechanism}"
    counter = tmp / f"{name}.count"
    job_mode = "python" if row.mechanism == MechanismName.SIGNAL and mode != "gpu" else mode
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed below
    command = [sys.executable, "-m", "gpreempt", "run", "--runtime-dir", str(runtime)]
    command += ["--mechanism", row.mechanism, "--priority", "low", "--name", name]
    command += ["--", sys.executable, "-c", JOB, str(counter), job_mode]
    job = subprocess.Popen(command, env=_env(runtime), stdout=log, stderr=log)
    try:
        if not _wait_progress(counter, job, START_TIMEOUT_S):
            row.stopped = False
            row.note = _why(tmp / f"{name}.log", "the job did not start")
            return
        start = time.perf_counter()
        held = _control(runtime, "suspend", name)
        row.suspend_ms = (time.perf_counter() - start) * 1e3
        if held is not None:
            row.stopped, row.note = False, held
            return
        time.sleep(0.3)  # what was in flight when it was suspended may still finish
        before = _count(counter)
        time.sleep(STILL_S)
        row.stopped = _count(counter) == before
        released = _control(runtime, "resume", name)
        if released is not None:
            row.resumed, row.note = False, released
            return
        row.resumed = _wait_progress(counter, job, RESUME_TIMEOUT_S, after=_count(counter))
        if not row.stopped:
            row.note = "the job kept making progress while suspended"
        elif not row.resumed:
            row.note = "the job made no progress after resume"
    finally:
        with contextlib.suppress(ProcessLookupError):
            job.send_signal(signal.SIGTERM)
        try:
            job.wait(15)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
        log.close()


def _count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _wait_progress(
    path: Path, job: subprocess.Popen[bytes], timeout: float, after: int = 0
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _count(path) > after:
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


def _report(rows: list[Row], where: str, as_json: bool) -> None:
    if as_json:
        listed = [asdict(r) | {"works": r.works} for r in rows]
        print(json.dumps({"machine": where, "rows": listed}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gpreempt selftest: {where}")
    for column in ("mechanism", "here", "stops", "resumes", "suspend call", "result", "note"):
        table.add_column(column)

    def mark(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "NO")

    for r in rows:
        result = "works" if r.works else ("not here" if not r.exists else "FAILS")
        ms = f"{r.suspend_ms:.1f} ms" if r.suspend_ms is not None else "-"
        table.add_row(
            r.mechanism, mark(r.exists), mark(r.stopped), mark(r.resumed), ms, result, r.note
        )
    Console(width=max(100, shutil.get_terminal_size().columns)).print(table)
