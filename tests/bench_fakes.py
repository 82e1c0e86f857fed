"""Stand-ins for the benchmark's GPU workloads and for the gpreempt daemon, for CPU tests.

``serve_factory``/``train_factory`` are what ``--case-a-fn``/``--case-b-fn`` take;
``FakeMemory`` is a device memory (``--memory-fn``) kept as a JSON pool in the file
$FAKE_GPU_POOL, shared by every process. Running this file as a script emulates
``gpreempt serve`` (answers ping, writes an event log, logs its command line to daemon.log) and
``gpreempt run`` (runs the command and logs a ``registered`` event with its command line; a
high-priority task logs a suspend/resume of case-b-0; one with ``--reserve-memory`` moves the
other processes' pool memory out while the pool's free memory is below its reserve, as an
eviction, and back when its command ends).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 1 << 30


def serve_factory():
    """One request = busy-wait FAKE_SERVICE_S seconds (default 2 ms)."""
    service = float(os.environ.get("FAKE_SERVICE_S", "0.002"))

    def handle() -> None:
        end = time.perf_counter() + service
        while time.perf_counter() < end:
            pass

    return handle


def train_factory():
    """One step = sleep FAKE_STEP_S seconds (default 5 ms)."""
    step_s = float(os.environ.get("FAKE_STEP_S", "0.005"))
    exit_after = float(os.environ.get("FAKE_TRAIN_EXIT_AFTER_S", "0") or 0)
    born = time.monotonic()
    env_log = os.environ.get("FAKE_ENV_LOG")
    if env_log:
        seen = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_MPS", "FAKE_SETTING"))}
        Path(env_log, f"train-{os.getpid()}.json").write_text(json.dumps(seen))

    def step() -> None:
        time.sleep(step_s)
        if exit_after and time.monotonic() - born > exit_after:
            os._exit(3)

    return step


@contextlib.contextmanager
def _pool():
    """The fake GPU's memory {"free": bytes, "held": {pid: bytes}}, locked while in use."""
    path = Path(os.environ["FAKE_GPU_POOL"])
    with open(path, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        state = json.loads(handle.read())
        for pid, size in list(state["held"].items()):  # a process's memory ends with it
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                state["free"] += max(0, size)
                del state["held"][pid]
        yield state
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(state))


class FakeMemory:
    """Device memory from the shared pool file; blocks are byte counts."""

    def free_bytes(self) -> int:
        with _pool() as state:
            return state["free"]

    def allocate(self, nbytes: int) -> int:
        with _pool() as state:
            if state["free"] < nbytes:
                raise MemoryError(f"fake GPU: {nbytes} bytes asked, {state['free']} free")
            state["free"] -= nbytes
            pid = str(os.getpid())
            state["held"][pid] = state["held"].get(pid, 0) + nbytes
        return nbytes

    def release(self, blocks: list) -> None:
        with _pool() as state:
            pid = str(os.getpid())
            state["free"] += sum(blocks)
            state["held"][pid] = state["held"].get(pid, 0) - sum(blocks)
        blocks.clear()


def _evictor(runtime_dir: Path, reserve: int, own_pid: int, done: threading.Event) -> None:
    """While ``done`` is unset: when free < reserve, move the other pids' memory out (evict);
    once set, move it back (restore)."""
    moved: dict[str, int] = {}
    while not done.wait(0.01):
        with _pool() as state:
            if moved or state["free"] >= reserve:
                continue
            moved = {p: b for p, b in state["held"].items() if p != str(own_pid) and b > 0}
            for pid, size in moved.items():
                state["held"][pid] = 0
                state["free"] += size
        if moved:
            total = sum(moved.values())
            _event(
                runtime_dir,
                task="case-b-0",
                event="evict",
                bytes=total,
                latency_ms=40.0,
                gb_per_s=round(total / 0.04 / 1e9, 3),
            )
    if moved:
        with _pool() as state:
            for pid, size in moved.items():
                state["held"][pid] = state["held"].get(pid, 0) + size
                state["free"] -= size
        total = sum(moved.values())
        _event(
            runtime_dir,
            task="case-b-0",
            event="restore",
            bytes=total,
            latency_ms=50.0,
            gb_per_s=round(total / 0.05 / 1e9, 3),
        )


def _event(runtime_dir: Path, **fields: object) -> None:
    fields.setdefault("t", time.time())
    with open(runtime_dir / "events.jsonl", "a") as log:
        log.write(json.dumps(fields) + "\n")


def fake_serve(runtime_dir: Path) -> int:
    runtime_dir.mkdir(parents=True, exist_ok=True)
    (runtime_dir / "daemon.log").write_text(json.dumps(sys.argv[1:]) + "\n")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(runtime_dir / "gpreempt.sock"))
    server.listen()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        conn, _ = server.accept()
        with conn:
            data = conn.recv(65536)
            if data:
                conn.sendall(b'{"ok": true}\n')


def fake_run(argv: list[str]) -> int:
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    runtime_dir = Path(options[options.index("--runtime-dir") + 1])
    name = options[options.index("--name") + 1]
    high = options[options.index("--priority") + 1] == "high"
    _event(runtime_dir, task=name, event="registered", argv=argv)
    child = subprocess.Popen(command)
    done = threading.Event()
    evictor = None
    if "--reserve-memory" in options:
        reserve = options[options.index("--reserve-memory") + 1]
        assert reserve.endswith("MiB"), reserve
        evictor = threading.Thread(
            target=_evictor, args=(runtime_dir, int(reserve[:-3]) << 20, child.pid, done)
        )
        evictor.start()
    if high:  # "suspend" case-b-0 once Case-A's window has begun
        go = Path(command[command.index("--go-file") + 1])
        while not go.exists() and child.poll() is None:
            time.sleep(0.005)
        if go.exists():
            time.sleep(max(0.0, json.loads(go.read_text())["t0"] + 0.01 - time.time()))
        _event(runtime_dir, task="case-b-0", event="suspend", mechanism="signal", latency_ms=0.25)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    code = child.wait()
    if evictor is not None:
        done.set()
        evictor.join()
    if high:
        _event(runtime_dir, task="case-b-0", event="resume", mechanism="signal", latency_ms=0.1)
    _event(runtime_dir, task=name, event="exit")
    return code


def fake_train_command() -> int:
    """A Case-B *command*: the protocol of ``--case-b-cmd`` (ready file, steps file, SIGTERM)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(0.1)
    Path(os.environ["GPREEMPT_BENCH_READY_FILE"]).touch()
    with open(os.environ["GPREEMPT_BENCH_STEPS_FILE"], "a", buffering=1) as steps:
        while True:
            time.sleep(0.005)
            steps.write(f"{time.time()}\n")


if __name__ == "__main__":
    if sys.argv[1] == "train-cmd":
        sys.exit(fake_train_command())
    if sys.argv[1] == "serve":
        sys.exit(fake_serve(Path(sys.argv[sys.argv.index("--runtime-dir") + 1])))
    sys.exit(fake_run(sys.argv[2:]))
