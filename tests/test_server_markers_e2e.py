"""A real server under `gpreempt run --priority high` marks its requests with no code: a low
task under `--mechanism signal` is stopped while an HTTP request (plain or streamed) or a gRPC
call is in flight, and goes on once it ended."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import (
    Counter,
    Daemon,
    process_state,
    run_counter,
    spawn,
    task_named,
    wait_for,
)

pytestmark = pytest.mark.slow

#: A Starlette app under uvicorn: /slow answers once the file ?f= exists, /stream sends a
#: line, then three more once the file ?f= exists (each waits 20 s at most), so that a test
#: ends a request once it has checked what it must while the request is in flight.
#: argv: the file to write its port to.
ASGI_SERVER = """
import asyncio, os, socket, sys, pathlib
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

async def released(request):
    path = request.query_params["f"]
    for _ in range(2000):
        if os.path.exists(path):
            return
        await asyncio.sleep(0.01)

async def slow(request):
    await released(request)
    return PlainTextResponse("done")

async def stream(request):
    async def lines():
        yield "0\\n"
        await released(request)
        for i in range(1, 4):
            yield f"{i}\\n"
    return StreamingResponse(lines())

app = Starlette(routes=[Route("/slow", slow), Route("/stream", stream)])
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
sock.bind(("127.0.0.1", 0))
sock.listen(16)
pathlib.Path(sys.argv[1]).write_text(str(sock.getsockname()[1]))
server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
asyncio.run(server.serve(sockets=[sock]))
"""

#: A grpcio server with byte messages: /t.T/Slow answers after 1.5 s, /t.T/Stream sends 4
#: messages 0.4 s apart. argv: the file to write its port to.
GRPC_SERVER = """
import sys, time, pathlib
from concurrent import futures
import grpc

def slow(request, context):
    time.sleep(1.5)
    return b"done"

def stream(request, context):
    for i in range(4):
        yield str(i).encode()
        time.sleep(0.4)

handlers = grpc.method_handlers_generic_handler("t.T", {
    "Slow": grpc.unary_unary_rpc_method_handler(slow),
    "Stream": grpc.unary_stream_rpc_method_handler(stream),
})
server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handlers])
port = server.add_insecure_port("127.0.0.1:0")
server.start()
pathlib.Path(sys.argv[1]).write_text(str(port))
server.wait_for_termination()
"""


#: transformers' GenerationMixin as a stand-in: generate(until) decodes until the file ``until``
#: exists (20 s at most).
FAKE_GENERATION = """
import os, time

class GenerationMixin:
    def generate(self, until):
        end = time.monotonic() + 20
        while not os.path.exists(until) and time.monotonic() < end:
            time.sleep(0.01)
"""

#: A server that decodes in a loop of its own: one generate call once told to, until the test
#: releases it. argv: its directory (ready, go, release and done files), the directory holding
#: the stand-in.
GENERATE_SERVER = """
import pathlib, sys, time
sys.path.insert(0, sys.argv[2])
from transformers.generation.utils import GenerationMixin

class Model(GenerationMixin):
    pass

here = pathlib.Path(sys.argv[1])
(here / "ready").write_text("1")
while not (here / "go").exists():
    time.sleep(0.01)
Model().generate(here / "release")
(here / "done").write_text("1")
time.sleep(60)
"""


@pytest.fixture
def trainer(daemon: Daemon, runtime_dir: Path, counter_script: Path, tmp_path: Path) -> Iterator:
    """A low task under --mechanism signal, counting."""
    progress = tmp_path / "progress"
    low = run_counter(
        runtime_dir, counter_script, progress,
        "--priority", "low", "--mechanism", "signal", "--name", "trainer",
    )  # fmt: skip
    counter = Counter(progress)
    try:
        assert wait_for(lambda: counter.value() > 0), "the low task never ran"
        assert wait_for(lambda: task_named(runtime_dir, "trainer") is not None)
        yield task_named(runtime_dir, "trainer")["pid"], counter
    finally:
        low.send_signal(signal.SIGTERM)
        low.wait(10)


def start_server(runtime_dir: Path, tmp_path: Path, source: str) -> tuple[subprocess.Popen, int]:
    """`gpreempt run --priority high` of a server script; returns it and its port."""
    script, port_file = tmp_path / "server.py", tmp_path / "port"
    script.write_text(source)
    server = spawn(
        runtime_dir, "run", "--priority", "high", "--name", "server", "--",
        sys.executable, str(script), str(port_file),
    )  # fmt: skip
    if not wait_for(port_file.exists, 60):
        server.kill()
        pytest.fail(f"the server did not start: {server.communicate()}")
    time.sleep(0.1)
    return server, int(port_file.read_text())


def _released(url: str, done: Path) -> str:
    """``url`` of the ASGI server, whose request ends once the file ``done`` exists."""
    return f"{url}?f={urllib.parse.quote(str(done))}"


def stopped(pid: int) -> bool:
    return process_state(pid) == "T"


def in_flight(call: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def check_held_while(
    runtime_dir: Path, counter: Counter, low_pid: int, ended: Callable, release: Path | None = None
) -> None:
    """While a request is in flight (until ``ended()``): the low task is stopped and makes no
    progress; after it, the low task runs again. ``release``: a file whose creation lets the
    request end (after those checks)."""
    assert wait_for(lambda: stopped(low_pid), 5), "the low task was not stopped"
    assert task_named(runtime_dir, "trainer")["state"] == "suspended"
    assert counter.progress_over(0.3) == 0, "the low task progressed inside the request"
    if release is not None:
        release.touch()
    assert wait_for(ended, 10)
    assert counter.advances(5), "the low task did not resume"


def test_asgi_requests_stop_the_low_task_until_their_last_byte(
    trainer, runtime_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    low_pid, counter = trainer
    server, port = start_server(runtime_dir, tmp_path, ASGI_SERVER)
    try:
        assert wait_for(lambda: task_named(runtime_dir, "server")["marker"] == "asgi", 10)
        assert counter.advances(0.3), "an idle server held the low task"
        url = f"http://127.0.0.1:{port}"
        slow_done, stream_done = tmp_path / "slow-done", tmp_path / "stream-done"
        answered: list[bytes] = []
        slow = _released(f"{url}/slow", slow_done)
        thread = in_flight(lambda: answered.append(urllib.request.urlopen(slow).read()))
        check_held_while(runtime_dir, counter, low_pid, lambda: not thread.is_alive(), slow_done)
        assert answered == [b"done"]

        with urllib.request.urlopen(_released(f"{url}/stream", stream_done)) as response:
            assert response.readline() == b"0\n"  # the response has started...
            time.sleep(0.1)
            assert stopped(low_pid), "the low task ran during a streamed response"
            assert counter.progress_over(0.3) == 0
            stream_done.touch()
            assert response.read() == b"1\n2\n3\n"  # ...and is over
        assert counter.advances(5), "the low task did not resume"
        assert task_named(runtime_dir, "trainer")["preemptions"] >= 2
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)


def test_asgi_requests_are_not_marked_when_opted_out(
    trainer, runtime_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    monkeypatch.setenv("GPREEMPT_AUTO_REQUESTS", "0")
    low_pid, counter = trainer
    server, port = start_server(runtime_dir, tmp_path, ASGI_SERVER)
    done = tmp_path / "slow-done"
    try:
        url = _released(f"http://127.0.0.1:{port}/slow", done)
        thread = in_flight(lambda: urllib.request.urlopen(url).read())
        time.sleep(0.3)
        assert thread.is_alive()
        assert counter.advances(0.5), "the low task was stopped"
        assert task_named(runtime_dir, "server")["marker"] == "none"
        done.touch()
        thread.join(10)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)


# skipped before the trainer fixture starts a daemon and a task for nothing
@pytest.mark.skipif(importlib.util.find_spec("grpc") is None, reason="grpcio is not installed")
def test_grpc_calls_stop_the_low_task_until_they_end(
    trainer, runtime_dir: Path, tmp_path: Path
) -> None:
    grpc = pytest.importorskip("grpc")
    low_pid, counter = trainer
    server, port = start_server(runtime_dir, tmp_path, GRPC_SERVER)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        assert wait_for(lambda: task_named(runtime_dir, "server")["marker"] == "grpc", 10)
        assert counter.advances(0.3), "an idle server held the low task"
        answered: list[bytes] = []
        slow = channel.unary_unary("/t.T/Slow")
        thread = in_flight(lambda: answered.append(slow(b"", timeout=20)))
        check_held_while(runtime_dir, counter, low_pid, lambda: not thread.is_alive())
        assert answered == [b"done"]

        responses = channel.unary_stream("/t.T/Stream")(b"", timeout=20)
        assert next(responses) == b"0"
        time.sleep(0.1)
        assert stopped(low_pid), "the low task ran during a streamed response"
        assert counter.progress_over(0.3) == 0
        assert list(responses) == [b"1", b"2", b"3"]
        assert counter.advances(5), "the low task did not resume"
    finally:
        channel.close()
        server.send_signal(signal.SIGTERM)
        server.wait(10)


def test_generate_calls_stop_the_low_task_until_they_return(
    trainer, runtime_dir: Path, tmp_path: Path
) -> None:
    low_pid, counter = trainer
    generation = tmp_path / "pkg" / "transformers" / "generation"
    generation.mkdir(parents=True)
    (generation.parent / "__init__.py").write_text("")
    (generation / "__init__.py").write_text("")
    (generation / "utils.py").write_text(FAKE_GENERATION)
    script = tmp_path / "server.py"
    script.write_text(GENERATE_SERVER)
    server = spawn(
        runtime_dir, "run", "--priority", "high", "--name", "server", "--",
        sys.executable, str(script), str(tmp_path), str(tmp_path / "pkg"),
    )  # fmt: skip
    try:
        assert wait_for((tmp_path / "ready").exists, 60), "the server did not start"
        assert counter.advances(0.3), "an idle server held the low task"
        (tmp_path / "go").write_text("1")
        done = (tmp_path / "done").exists
        check_held_while(runtime_dir, counter, low_pid, done, tmp_path / "release")
        assert task_named(runtime_dir, "server")["marker"] == "generate"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)
