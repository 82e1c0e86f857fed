"""How the self-test holds its job and judges a mechanism (see :mod:`gpreempt.cli.selftest`).

A suspension does not stop at once what the job had already queued: the driver lock, a gate
without stream barriers and a gate whose barriers are off only stop *new* launches, and the
job keeps up to 64 steps queued (about 0.6 s of GPU work on an H100). So after the suspension
the self-test first waits for the progress to stop (:func:`drain`: it reads the counter every
few milliseconds until it has not moved for :data:`QUIET_S`, at most :data:`DRAIN_LIMIT_S`),
records how long that took, and only then demands that the progress stand still for
:data:`STILL_S`.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..names import MechanismName
from ._selftest_probe import KIND, KIND_GPU, PID, Counter
from ._selftest_rows import FAILS, WORKS, Row

#: How often progress is read while the job drains; how long it must then not move to count
#: as drained (longer than one step of the job, 10 ms on an H100, a few on a CPU); how long
#: it may go on at most before the mechanism is said to fail.
POLL_S = 0.005
QUIET_S = 0.25
DRAIN_LIMIT_S = 10.0
#: How long progress must then stand still, and how soon it must come back after resume.
STILL_S = 1.0
RESUME_TIMEOUT_S = 10.0
#: Steps the job may complete after the suspension was asked for its stream barriers to count
#: as holding it. A barrier lies behind every kernel of the job (each matmul is more GPU time
#: than the barriers' spacing, and the driver-level gate puts one behind every kernel of
#: 0.1 ms or more), so once the gate word is closed the GPU finishes at most the step it is
#: in; the suspend call itself takes a few milliseconds, less than one step (10 ms on an
#: H100). Without barriers the queued steps drain: the open window's 25 ms (2-3 steps) behind
#: a gate, all 64 behind the driver lock.
BARRIER_MAX_STEPS = 2


@dataclass
class Drain:
    """What :func:`drain` saw: whether the progress stopped, when it last moved (ms after the
    suspension was asked for) and by how many steps it moved since."""

    stopped: bool
    ms: float
    steps: int


def drain(
    read: Callable[[], int],
    asked_at: float,
    before: int,
    quiet_s: float | None = None,
    limit_s: float | None = None,
) -> Drain:
    """Read the progress (``read``) until it has not moved for ``quiet_s``, or ``limit_s``
    after ``asked_at`` (``time.perf_counter()`` when the suspension was asked for; ``before``:
    the progress then)."""
    quiet_s = QUIET_S if quiet_s is None else quiet_s
    limit_s = DRAIN_LIMIT_S if limit_s is None else limit_s
    last, last_at = before, asked_at
    while True:
        value, now = read(), time.perf_counter()
        if value != last:
            last, last_at = value, now
        elif now - last_at >= quiet_s:
            return Drain(True, (last_at - asked_at) * 1e3, value - before)
        if now - asked_at >= limit_s:
            return Drain(False, (last_at - asked_at) * 1e3, value - before)
        time.sleep(POLL_S)


def hold_and_release(
    row: Row, runtime: Path, name: str, counter: Counter, job: subprocess.Popen[bytes], mode: str
) -> None:
    """Suspend the job ``name``, wait for its queued work to drain, check that its progress
    stands still, resume it and judge ``row``."""
    # signal stops the CPU side only: its proof is the launches; the others hold the GPU
    cpu_side = row.mechanism == MechanismName.SIGNAL

    def read() -> int:
        return counter.launched if cpu_side else counter.executed

    before, executed = read(), counter.executed
    asked = time.perf_counter()
    failed = control(runtime, "suspend", name)
    row.suspend_ms = round((time.perf_counter() - asked) * 1e3, 1)
    if failed is not None:
        row.verdict, row.note = FAILS, failed
        return
    if row.mechanism == MechanismName.KFD:
        row.queues = held_queues(counter.word(PID))
    drained = drain(read, asked, before)
    row.drained = drained.steps
    row.stopped = drained.stopped
    if drained.stopped:
        row.drain_ms = round(drained.ms, 1)
        still = read()
        time.sleep(STILL_S)
        row.stopped = read() == still
    row.pending = counter.launched - counter.executed
    ran_on = counter.executed - executed
    listed = task(runtime, name)  # while held: a failed suspension's error is still there
    failed = control(runtime, "resume", name)
    if failed is not None:
        row.resumed, row.verdict, row.note = False, FAILS, failed
        return
    after = counter.executed
    row.resumed = wait(lambda: counter.executed > after, job, RESUME_TIMEOUT_S)
    gpu_counted = mode == "gpu" and counter.word(KIND) == KIND_GPU
    judge(row, gpu_counted, ran_on, listed)


def judge(row: Row, gpu_counted: bool, ran_on: int, listed: dict[str, Any]) -> None:
    """Fill in ``row``'s verdict and note; ``listed``: its task as the daemon shows it."""
    used, error = listed.get("last_mechanism"), listed.get("suspend_error")
    if not row.stopped:
        row.verdict, row.note = FAILS, "the job kept making progress while suspended"
        if error:  # the daemon says why its mechanism did not hold the job
            row.note = f"the job kept making progress: {error}"
    elif not row.resumed:
        row.verdict, row.note = FAILS, "the job made no progress after resume"
    elif row.mechanism == MechanismName.SIGNAL:
        row.verdict = WORKS
        if gpu_counted and ran_on:
            row.note = f"the GPU ran on ({steps(ran_on)} queued) while the process stood still"
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
            row.note = f"{row.queues} queues held with {steps(row.pending or 0)} pending"


def barrier_row(name: str, gate: Row, beside: str) -> Row:
    """The stream barriers of ``gate``'s row, proven only by steps they held queued (launched
    and never executed while the GPU stood still: no CPU-side stop can leave work pending on
    the GPU) and by the GPU stopping within :data:`BARRIER_MAX_STEPS` of the suspension.

    ``beside``: why the barriers could not be shown ("" if they could): no more important task
    was registered beside the job (none were put), or what the job had queued before that
    (without barriers) did not run."""
    row = Row(
        name,
        stopped=gate.stopped,
        resumed=gate.resumed,
        pending=gate.pending,
        drain_ms=gate.drain_ms,
        drained=gate.drained,
    )
    if gate.verdict == FAILS:
        row.note = "the gate failed"
    elif beside:
        row.note = beside
    elif gate.verdict != WORKS:  # not read from GPU memory, the driver-level gate not on
        row.note = gate.note
    elif not gate.pending:
        row.note = "no kernel was held queued behind a barrier (barriers off?)"
    elif gate.drained is not None and gate.drained > BARRIER_MAX_STEPS:
        row.verdict = FAILS
        ran = f"the GPU ran {steps(gate.drained)} after the suspend (over {BARRIER_MAX_STEPS})"
        row.note = f"{steps(gate.pending)} held queued, but {ran}"
    else:
        row.verdict = WORKS
        row.note = f"{steps(gate.pending)} held queued behind a barrier, {gate.drained} run after "
        row.note += "the suspend"
    return row


def steps(count: int) -> str:
    """``1 step``, ``3 steps``."""
    return f"{count} step{'' if count == 1 else 's'}"


def held_queues(pid: int) -> int | None:
    from ..errors import GpreemptError
    from ..mechanisms.kfd import request

    try:
        value = request(pid, "held").get("suspended")
    except GpreemptError:
        return None
    return value if isinstance(value, int) else None


def task(runtime: Path, name: str) -> dict[str, Any]:
    """The task called ``name`` as ``gpreempt status --json`` shows it ({} if none)."""
    from ..client.api import status
    from ..errors import GpreemptError

    with contextlib.suppress(GpreemptError):
        for listed in status(runtime_dir=runtime).get("tasks", []):
            if listed.get("name") == name:
                return dict(listed)
    return {}


def wait(ready: Callable[[], bool], job: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``ready()`` came true within ``timeout`` while ``job`` ran."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        if job.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def control(runtime: Path, verb: str, name: str) -> str | None:
    """``gpreempt suspend|resume NAME``; None on success, else the error line."""
    from ..client.api import resume, suspend
    from ..errors import GpreemptError

    try:
        (suspend if verb == "suspend" else resume)(name, runtime_dir=runtime)
    except GpreemptError as exc:
        return f"{verb} failed: {exc}"
    return None
