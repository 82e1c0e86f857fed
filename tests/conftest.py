"""Shared fixtures: a private daemon per test, and workloads whose progress we can watch."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def load_script(relative: str) -> ModuleType:
    """A script of the repository that is no module of the package (``benchmarks/...py``),
    loaded afresh by its path from the repository's root."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_says_no_gpu(
    capsys: pytest.CaptureFixture[str], torch: ModuleType, relative: str, *argv: str
) -> None:
    """A GPU benchmark script run where ``torch`` (the caller's ``pytest.importorskip``, which
    keeps the test file among those that CI runs with PyTorch) has no GPU: exit code 2 and
    one line, ``NAME: no CUDA GPU here`` (skipped with a GPU)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert load_script(relative).main(list(argv)) == 2
    assert capsys.readouterr().err == f"{Path(relative).stem}: no CUDA GPU here\n"


def build_gate_rule(work: Path, program: str) -> Path:
    """``program`` (C++ that includes a header of the gate's ``csrc``) compiled in ``work`` as
    the gate compiles it, warnings as errors: the binary; the test is skipped without a
    compiler (``CXX``, else ``c++``)."""
    from gpreempt.client.gate.driver_build import CSRC

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C++ compiler ({compiler!r})")
    (work / "main.cpp").write_text(program)
    binary = work / "rule"
    subprocess.run(
        [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{CSRC}", "main.cpp", "-o",
         str(binary)],
        cwd=work, check=True,
    )  # fmt: skip
    return binary


def run_gate_rule(binary: Path, lines: Iterable[str]) -> list[str]:
    """What a program of :func:`build_gate_rule` prints, a line each, fed ``lines`` in order
    on its standard input; it must exit 0."""
    out = subprocess.run(
        [str(binary)], input="".join(f"{line}\n" for line in lines), capture_output=True,
        text=True,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout, out.stderr)
    return out.stdout.splitlines()


def gp_env(runtime_dir: Path) -> dict[str, str]:
    env = os.environ.copy()
    env["GPREEMPT_RUNTIME_DIR"] = str(runtime_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def gpreempt(runtime_dir: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run the CLI to completion."""
    return subprocess.run(
        [sys.executable, "-m", "gpreempt", *args],
        env=gp_env(runtime_dir),
        capture_output=True,
        text=True,
        timeout=kwargs.pop("timeout", 30),
        **kwargs,
    )


def status(runtime_dir: Path) -> dict:
    """The daemon's reply to ``status``, as ``gpreempt status --json`` prints it, asked from
    this process: tests poll it, and a CLI process costs a Python start each time (0.2-0.5 s
    on a loaded two-core machine). test_cli_status checks that the CLI prints the same."""
    from gpreempt.client.connection import DaemonClient

    with DaemonClient.connect(runtime_dir) as client:
        reply = client.status()
    reply.pop("ok", None)
    return reply


def tasks(runtime_dir: Path) -> list[dict]:
    """The daemon's tasks as ``status --json`` gives them."""
    return status(runtime_dir)["tasks"]


def task_named(runtime_dir: Path, name: str) -> dict | None:
    return next((t for t in tasks(runtime_dir) if t["name"] == name), None)


def spawn(runtime_dir: Path, *args: str) -> subprocess.Popen:
    """Start the CLI in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpreempt", *args],
        env=gp_env(runtime_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_all(*procs: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM every process, then wait for each (they end in parallel)."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout)


def run_counter(runtime_dir: Path, script: Path, progress: Path, *options: str) -> subprocess.Popen:
    """``gpreempt run OPTIONS -- python3 counter.py PROGRESS`` in the background."""
    return spawn(runtime_dir, "run", *options, "--", "python3", str(script), str(progress))


#: The marks of a GPU test that needs an NVIDIA GPU (``pytestmark = NVIDIA_GPU``).
NVIDIA_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU"),
]


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def progress_count(path: Path) -> int:
    """The count a GPU test's trainer writes after each step its GPU completed (0 before the
    first)."""
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def stands_still_through_a_request(runtime_dir: Path, go: Path, progress: Path) -> tuple[int, dict]:
    """Let the server start its two seconds of activity (it waits for ``go``) and check that
    the task named ``trainer`` makes no GPU progress for 1.2 s of it (after 0.3 s for what ran
    past its last barrier to complete), with no leak counted by its gate. Returns the count it
    stood at and its ``status``."""
    go.write_text("1")
    time.sleep(0.3)
    held_from = progress_count(progress)
    time.sleep(1.2)
    held_to = progress_count(progress)
    task = task_named(runtime_dir, "trainer")
    assert task is not None
    assert held_to == held_from, (held_from, held_to, task)
    assert task["gate"]["barrier_leaks"] == 0 and task["gate"]["hold_leaks"] == 0, task
    return held_to, task


def process_state(pid: int) -> str:
    """One-letter state from /proc (T = stopped), or '' if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return ""
    return stat[stat.rindex(")") + 2]


class Daemon:
    def __init__(self, runtime_dir: Path, *extra: str) -> None:
        self.runtime_dir = runtime_dir
        self.process = spawn(runtime_dir, "serve", "--runtime-dir", str(runtime_dir), *extra)
        if not wait_for(self.answers, 10):
            self.process.kill()
            raise RuntimeError(f"daemon did not start: {self.process.communicate()}")

    def answers(self) -> bool:
        from gpreempt.client.connection import DaemonClient
        from gpreempt.errors import DaemonUnavailable

        if self.process.poll() is not None:
            return False
        try:
            with DaemonClient.connect(self.runtime_dir, timeout=1) as client:
                return client.ping()["pid"] == self.process.pid
        except (DaemonUnavailable, OSError):
            return False

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def task_view(task_id: int, priority: int = 0, *, run: float = 0.0, **fields: Any) -> Any:
    """A policy's view of one task: on GPU 0 and active unless ``fields`` say otherwise."""
    from gpreempt.policy import TaskView

    return TaskView(
        task_id=task_id,
        priority=priority,
        run_seconds=run,
        **{"gpus": (0,), "active": True, **fields},
    )


@contextlib.contextmanager
def toggling(control, closed_s: float, open_s: float) -> Iterator[None]:
    """Close and open a control block's gate over and over from another thread; open at the end."""
    stop = threading.Event()

    def toggler() -> None:
        while not stop.is_set():
            control.set_gate(True)
            time.sleep(closed_s)
            control.set_gate(False)
            time.sleep(open_s)

    thread = threading.Thread(target=toggler)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        control.set_gate(False)


@pytest.fixture
def runtime_dir(tmp_path: Path) -> Path:
    # Unix socket paths are limited to 108 bytes: keep the directory short.
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gp-"))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@contextlib.contextmanager
def module_daemon(*extra: str) -> Iterator[Daemon]:
    """A daemon in a runtime directory of its own, for a module-scoped fixture: cases that
    each leave it as they found it (requests it refuses) share it, rather than each paying
    for a daemon's start."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gp-"))
    daemon = Daemon(path, *extra)
    try:
        yield daemon
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def daemon(runtime_dir: Path) -> Iterator[Daemon]:
    d = Daemon(runtime_dir)
    yield d
    d.stop()


COUNTER = """
import os, sys
path = sys.argv[1]
if len(sys.argv) > 2:  # share one core with the other counters: equal speed when running
    os.sched_setaffinity(0, {int(sys.argv[2])})
tmp = path + ".tmp"
i = 0
while True:
    i += 1
    if i % 2000 == 0:
        with open(tmp, "w") as f:
            f.write(str(i))
        os.replace(tmp, path)  # readers never see a half-written number
"""


#: A high-priority client that holds one request (for 1.5 s, or argv[4] s) once told to, then
#: stays idle. argv: runtime dir, the file that says go, the file that exists while the request
#: lasts, and optionally the seconds and a file that ends the request early once it exists
#: (a test that has checked what it must inside the request need not wait out the rest).
HOLDING_SERVER = """
import sys, time, pathlib
import gpreempt
gpreempt.attach("high", name="server", gate=False, runtime_dir=sys.argv[1])
go, inside = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 1.5
release = pathlib.Path(sys.argv[5]) if len(sys.argv) > 5 else None
while not go.exists():
    time.sleep(0.01)
with gpreempt.request():
    inside.touch()
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (release and release.exists()):
        time.sleep(0.01)
inside.unlink()
time.sleep(600)
"""


def wait_all_gone(pids: list[int], directory: Path, timeout: float = 15.0) -> None:
    """Wait until none of ``pids`` is alive and ``directory`` is empty; fail with what is
    left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) or list(directory.iterdir()):
        assert time.monotonic() < deadline, (
            [p for p in pids if alive(p)],
            list(directory.iterdir()),
        )
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


#: A PyTorch loop on CPU tensors (operators the gate sees) that writes its progress to argv[1].
TORCH_COUNTER = """
import os, sys, torch
path, tmp = sys.argv[1], sys.argv[1] + ".tmp"
x = torch.zeros(16)
i = 0
while True:
    x = x + 1          # a PyTorch operator: the gate sees it
    i += 1
    if i % 200 == 0:
        with open(tmp, "w") as f:
            f.write(str(i))
        os.replace(tmp, path)
"""


class Counter:
    """A CPU loop that writes its progress to a file: progress stops when it is suspended."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def value(self) -> int:
        try:
            return int(self.path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def progress_over(self, seconds: float) -> int:
        before = self.value()
        time.sleep(seconds)
        return self.value() - before

    def advances(self, within: float) -> bool:
        """Whether it makes progress within ``within`` seconds, known as soon as it does: what
        ``progress_over(within) > 0`` says of a counter that only counts up, without waiting
        out the rest (a check that it makes none must wait it out: ``progress_over``)."""
        before = self.value()
        return wait_for(lambda: self.value() > before, within, interval=0.005)


@pytest.fixture
def counter_script(tmp_path: Path) -> Path:
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    return script
