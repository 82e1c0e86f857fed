"""Stand-ins for the benchmark's GPU workloads and for the gpreempt daemon, for CPU tests.

``serve_factory``/``train_factory`` are what ``--case-a-fn``/``--case-b-fn`` take. Running this
file as a script emulates ``gpreempt serve`` (answers ping, writes an event log) and
``gpreempt run`` (runs the command; a high-priority task logs a suspend/resume of case-b-0).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


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
        seen = {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS")}
        Path(env_log, f"train-{os.getpid()}.json").write_text(json.dumps(seen))

    def step() -> None:
        time.sleep(step_s)
        if exit_after and time.monotonic() - born > exit_after:
            os._exit(3)

    return step


def _event(runtime_dir: Path, **fields: object) -> None:
    fields.setdefault("t", time.time())
    with open(runtime_dir / "events.jsonl", "a") as log:
        log.write(json.dumps(fields) + "\n")


def fake_serve(runtime_dir: Path) -> int:
    runtime_dir.mkdir(parents=True, exist_ok=True)
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
    child = subprocess.Popen(command)
    if high:  # "suspend" case-b-0 once Case-A's window has begun
        go = Path(command[command.index("--go-file") + 1])
        while not go.exists() and child.poll() is None:
            time.sleep(0.005)
        if go.exists():
            time.sleep(max(0.0, json.loads(go.read_text())["t0"] + 0.01 - time.time()))
        _event(runtime_dir, task="case-b-0", event="suspend", mechanism="signal", latency_ms=0.25)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    code = child.wait()
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
