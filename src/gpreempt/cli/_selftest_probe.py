"""The self-test's job and its housekeeping (see :mod:`gpreempt.cli.selftest`).

The job counts its progress in a page shared with the self-test: on a GPU, each step's last
kernel increments a word of that page, mapped for the GPU (``cuMemHostRegister`` or
``hipHostRegister``), so the count is what the GPU executed, read without the job's CPU; the
job also writes how many steps it launched, and keeps up to :data:`DEPTH` steps queued ahead,
so that a suspension finds GPU work pending. Without a GPU the job counts CPU steps.

Whatever ends the self-test (SIGKILL included), nothing is left behind: its daemon and
launchers get SIGKILL when it dies (``PR_SET_PDEATHSIG``), each job likewise when its launcher
dies, and a reaper process, started first, kills whatever the pid list names and removes the
directory once the self-test is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

#: Word indexes in the counter page (u32): steps the GPU executed, steps launched, the job's
#: pid, and how progress is counted.
EXECUTED, LAUNCHED, PID, KIND = 0, 16, 32, 48
#: KIND values: counted by the GPU in mapped memory; by the CPU (no GPU); by the CPU after a
#: synchronize because the page could not be mapped for the GPU (progress then unproven).
KIND_GPU, KIND_CPU, KIND_CPU_FALLBACK = 1, 2, 3
PAGE = 4096

JOB = r"""
import ctypes, mmap, os, signal, sys, time
path, mode = sys.argv[1], sys.argv[2]
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
if os.getppid() == 1:
    sys.exit(0)
f = open(path, "r+b")
mm = mmap.mmap(f.fileno(), 4096)
words = (ctypes.c_uint32 * 1024).from_buffer(mm)
EXECUTED, LAUNCHED, PID, KIND = 0, 16, 32, 48
words[PID] = os.getpid()
if mode == "python":
    words[KIND] = 2
    while True:
        sum(range(20000))
        words[LAUNCHED] += 1
        words[EXECUTED] += 1
        time.sleep(0.002)
import torch


def gpu_word(address):
    # the page mapped for the GPU; a tensor over the executed word (None: cannot map it)
    page = address & ~4095
    dev = ctypes.c_uint64()
    try:
        if torch.version.hip:
            for name in ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"):
                try:
                    lib = ctypes.CDLL(name)
                    break
                except OSError:
                    lib = None
            ok = lib is not None and lib.hipHostRegister(
                ctypes.c_void_p(page), ctypes.c_size_t(4096), ctypes.c_uint(3)
            ) == 0 and lib.hipHostGetDevicePointer(
                ctypes.byref(dev), ctypes.c_void_p(page), ctypes.c_uint(0)
            ) == 0
        else:
            lib = ctypes.CDLL("libcuda.so.1")
            ok = lib.cuMemHostRegister_v2(
                ctypes.c_void_p(page), ctypes.c_size_t(4096), ctypes.c_uint(3)
            ) == 0 and lib.cuMemHostGetDevicePointer_v2(
                ctypes.byref(dev), ctypes.c_void_p(page), ctypes.c_uint(0)
            ) == 0
    except (OSError, AttributeError):
        ok = False
    if not ok:
        return None

    class Word:
        __cuda_array_interface__ = {
            "shape": (1,), "typestr": "<i4", "version": 2,
            "data": (dev.value + (address - page), False),
        }

    try:
        return torch.as_tensor(Word(), device="cuda")
    except Exception:
        return None


x = torch.randn(4096, 4096, device="cuda")
counter = gpu_word(ctypes.addressof(words) + 4 * EXECUTED)
words[KIND] = 1 if counter is not None else 3
DEPTH = int(os.environ.get("GPREEMPT_SELFTEST_DEPTH", "64"))
launched = 0
while True:
    if launched - words[EXECUTED] >= DEPTH:
        time.sleep(0.0005)
        continue
    y = x
    for _ in range(4):
        y = torch.tanh(y @ x)
    if counter is not None:
        counter.add_(1)
    launched += 1
    words[LAUNCHED] = launched
    if counter is None:
        torch.cuda.synchronize()
        words[EXECUTED] = launched
"""

REAPER = r"""
import os, select, shutil, signal, sys
parent, tmp = int(sys.argv[1]), sys.argv[2]
try:
    select.select([os.pidfd_open(parent)], [], [])
except OSError:
    pass
try:
    with open(os.path.join(tmp, "pids")) as f:
        pids = [int(x) for x in f.read().split()]
except (OSError, ValueError):
    pids = []
for pid in pids:
    for target in (-pid, pid):  # a job leads its own group
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass
shutil.rmtree(tmp, ignore_errors=True)
"""


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL this child when the self-test dies, however it dies."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM a child of the self-test and reap it (SIGKILL after 10 s)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Workspace:
    """The self-test's directory, its reaper and the pids it must not leave behind."""

    def __init__(self) -> None:
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp"
        base = os.environ.get("TMPDIR") or shm  # tmpfs where possible: pages pinned for the GPU
        if len(base) > 60:  # the daemon's socket path inside must fit sun_path (108 bytes)
            base = shm
        self.path = Path(tempfile.mkdtemp(prefix="gpreempt-selftest-", dir=base))
        self.reaper = subprocess.Popen(
            [sys.executable, "-S", "-c", REAPER, str(os.getpid()), str(self.path)],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def record(self, pid: int) -> None:
        """Name a process the reaper kills if the self-test dies first."""
        with open(self.path / "pids", "a") as f:
            f.write(f"{pid}\n")

    def counter(self, name: str) -> Counter:
        path = self.path / f"{name}.counter"
        path.write_bytes(bytes(PAGE))
        return Counter(path)

    def close(self) -> None:
        """Remove the directory; the reaper then finds nothing to do and ends with us."""
        shutil.rmtree(self.path, ignore_errors=True)


class Counter:
    """The job's counter page, read by the self-test."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), PAGE)
        self._words = (ctypes.c_uint32 * (PAGE // 4)).from_buffer(self._map)

    def word(self, index: int) -> int:
        return int(self._words[index])

    @property
    def executed(self) -> int:
        return self.word(EXECUTED)

    @property
    def launched(self) -> int:
        return self.word(LAUNCHED)

    def close(self) -> None:
        del self._words
        with contextlib.suppress(BufferError):
            self._map.close()
