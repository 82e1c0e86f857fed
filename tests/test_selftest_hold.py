"""How ``gpreempt selftest`` judges a held job: only after what it had queued drained, the drain
time recorded; and when its stream barriers count as holding.

A stand-in job (a real process) counts steps in the self-test's counter page as the GPU job
does, says it is counted by the GPU, and on being "suspended" (a word of the page the test
sets in place of the daemon) goes on for a given time before it stops, as a GPU drains the
work queued ahead."""

from __future__ import annotations

import ctypes
import mmap
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpreempt.cli import _selftest_hold
from gpreempt.cli._selftest_hold import BARRIER_MAX_STEPS, barrier_row, hold_and_release
from gpreempt.cli._selftest_probe import Counter
from gpreempt.cli._selftest_rows import FAILS, UNPROVEN, WORKS, Row

#: The word of the counter page the stand-in job reads as "suspended".
HELD = 64

#: argv: the counter page, how long it goes on once held (< 0: for ever), steps launched ahead.
DRAINING_JOB = r"""
import ctypes, mmap, os, sys, time
path, drain_s, ahead = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
f = open(path, "r+b")
words = (ctypes.c_uint32 * 1024).from_buffer(mmap.mmap(f.fileno(), 4096))
EXECUTED, LAUNCHED, PID, KIND, HELD = 0, 16, 32, 48, 64
words[PID], words[KIND] = os.getpid(), 1  # counted "by the GPU"
held_since = None
while True:
    time.sleep(0.005)
    if not words[HELD]:
        held_since = None
    else:
        held_since = held_since or time.monotonic()
        if 0 <= drain_s <= time.monotonic() - held_since:
            continue  # drained: stands still until released
    words[EXECUTED] += 1
    words[LAUNCHED] = words[EXECUTED] + ahead
"""


class Job:
    """The stand-in job over a fresh counter page, and the test's own view of that page."""

    def __init__(self, page: Path, drain_s: float, ahead: int = 0) -> None:
        page.write_bytes(bytes(4096))
        self.counter = Counter(page)
        argv = [sys.executable, "-c", DRAINING_JOB, str(self.counter.path), str(drain_s)]
        self.process = subprocess.Popen([*argv, str(ahead)])
        with open(self.counter.path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 4096)
        self.words = (ctypes.c_uint32 * 1024).from_buffer(self._map)
        deadline = time.monotonic() + 10
        while self.counter.executed == 0:
            assert time.monotonic() < deadline, "the stand-in job did not start"
            time.sleep(0.01)

    def control(self, runtime: Path, verb: str, name: str) -> str | None:
        """In place of ``gpreempt suspend|resume``."""
        self.words[HELD] = 1 if verb == "suspend" else 0
        return None

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        del self.words
        self._map.close()
        self.counter.close()


@pytest.fixture
def job(request, monkeypatch, tmp_path):
    drain_s, ahead = request.param
    job = Job(tmp_path / "job.counter", drain_s, ahead)
    monkeypatch.setattr(_selftest_hold, "control", job.control)
    monkeypatch.setattr(_selftest_hold, "task", lambda runtime, name: {"last_mechanism": "gate"})
    yield job
    job.close()


def hold(job: Job, mechanism: str = "gate") -> Row:
    row = Row(mechanism)
    hold_and_release(row, Path("/nonexistent"), "job", job.counter, job.process, "gpu")
    return row


@pytest.mark.parametrize("job", [(0.4, 0)], indirect=True)
def test_a_job_that_drains_then_stops_works_with_its_drain_time(job) -> None:
    row = hold(job)
    assert row.verdict == WORKS and row.stopped and row.resumed, row
    assert 350 <= row.drain_ms < 1000, row  # the 0.4 s it went on, read every few ms
    assert row.drained > 10  # steps it completed meanwhile (one per 5 ms)


@pytest.mark.parametrize("job", [(-1, 0)], indirect=True)
def test_a_job_that_never_stops_fails(job, monkeypatch) -> None:
    monkeypatch.setattr(_selftest_hold, "DRAIN_LIMIT_S", 1.0)
    start = time.monotonic()
    row = hold(job)
    assert time.monotonic() - start < 5
    assert row.verdict == FAILS and row.stopped is False, row
    assert row.note == "the job kept making progress while suspended"
    assert row.drain_ms is None


@pytest.mark.parametrize("job", [(0.4, 0)], indirect=True)
def test_signal_drains_on_the_launches(job) -> None:
    # the CPU side is what signal stops: the stand-in's launches drain like its steps
    row = hold(job, "signal")
    assert row.verdict == WORKS and 350 <= row.drain_ms < 1000, row


def gate_row(**fields) -> Row:
    base = dict(verdict=WORKS, stopped=True, resumed=True, pending=3, drain_ms=9.0, drained=1)
    return Row("gate", **(base | fields))


def test_barriers_work_when_steps_stay_queued_and_the_gpu_stops_at_once() -> None:
    row = barrier_row("barriers", gate_row(), "")
    assert row.verdict == WORKS and row.mechanism == "barriers"
    assert row.pending == 3 and row.drain_ms == 9.0 and row.drained == 1
    assert row.note == "3 steps held queued behind a barrier, 1 run after the suspend"


def test_barriers_that_let_the_queue_run_on_fail() -> None:
    gate = gate_row(drained=BARRIER_MAX_STEPS + 5, drain_ms=80.0)
    row = barrier_row("driver-barriers", gate, "")
    assert row.verdict == FAILS and f"the GPU ran {BARRIER_MAX_STEPS + 5} steps" in row.note


@pytest.mark.parametrize(
    ("gate", "beside", "note"),
    [
        (gate_row(pending=0), "", "no kernel was held queued behind a barrier"),
        (gate_row(), "the more important task did not start", "the more important task"),
        (gate_row(verdict=FAILS), "", "the gate failed"),
        (gate_row(verdict=UNPROVEN, note="the driver-level gate was none"), "", "none"),
    ],
)
def test_barriers_unproven(gate, beside, note) -> None:
    row = barrier_row("barriers", gate, beside)
    assert row.verdict == UNPROVEN and note in row.note


@pytest.mark.parametrize("job", [(-1, 0)], indirect=True)
def test_a_job_not_held_says_why_the_daemon_could_not(job, monkeypatch) -> None:
    monkeypatch.setattr(_selftest_hold, "DRAIN_LIMIT_S", 1.0)
    error = "suspend failed: cuCheckpointProcessLock(pid 1) failed: CUDA_ERROR_NOT_SUPPORTED"
    monkeypatch.setattr(_selftest_hold, "task", lambda runtime, name: {"suspend_error": error})
    row = hold(job, "lock")
    assert row.verdict == FAILS and row.note == f"the job kept making progress: {error}"
