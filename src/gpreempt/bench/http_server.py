"""A Case-A handler served over HTTP, as people serve a model: a FastAPI app (Starlette where
FastAPI is missing) under uvicorn, in a process of its own, and the client the bench calls.

Server: ``python -m gpreempt.bench.http_server --fn MODULE:FACTORY --port-file F
[--by-hand]``; ``POST /infer`` runs one request of the handler in a plain ``def`` endpoint
(FastAPI runs it on its thread pool) and answers ``{"ok": true}``; ``--by-hand`` wraps it in
``gpreempt.request()``. It listens on a free port of 127.0.0.1, writes the port to the port
file, and exits when the process that started it does.

Client: :func:`start_client` starts the server beside the calling process (its child: under
``gpreempt run`` the same task) and returns a handler that sends one request over a kept-alive
connection and returns once the answer has arrived, so the bench's open-loop arrivals time the
whole HTTP round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: How each client variant starts its server: automatic marker, none, ``request()`` by hand.
MARKINGS = ("auto", "off", "hand")
START_TIMEOUT_S = 600.0


def build_app(handle: Callable[[], Any], by_hand: bool) -> Any:
    """The app: ``POST /infer`` runs ``handle()`` (inside ``gpreempt.request()`` if
    ``by_hand``)."""
    hint: Callable[[], Any] = contextlib.nullcontext
    if by_hand:
        import gpreempt

        hint = gpreempt.request

    def infer() -> dict[str, bool]:
        with hint():
            handle()
        return {"ok": True}

    try:
        from fastapi import FastAPI
    except ImportError:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        def endpoint(request: Any) -> Any:
            return JSONResponse(infer())

        return Starlette(routes=[Route("/infer", endpoint, methods=["POST"])])
    app = FastAPI()
    app.post("/infer")(infer)
    return app


def _exit_with_parent(parent: int) -> None:
    """Leave once the process that started this server is gone (its bench run ended)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpreempt.bench.http_server")
    parser.add_argument("--fn", required=True, help="MODULE:FACTORY of the request handler")
    parser.add_argument("--port-file", required=True, help="the port is written here")
    parser.add_argument("--by-hand", action="store_true", help="gpreempt.request() by hand")
    args = parser.parse_args(argv)
    _exit_with_parent(os.getppid())
    import uvicorn

    from .loops import load_callable

    app = build_app(load_callable(args.fn)(), args.by_hand)
    # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on its connections: without it a
    # kept-alive connection waits 40 ms for each answer (Nagle against delayed ACKs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    port_file = Path(args.port_file)
    port_file.with_suffix(".tmp").write_text(str(sock.getsockname()[1]))
    os.replace(port_file.with_suffix(".tmp"), port_file)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))
    return 0


class HttpClient:
    """The server's process and one kept-alive connection to it."""

    def __init__(self, fn: str, marking: str) -> None:
        if marking not in MARKINGS:
            raise ValueError(f"marking must be one of {', '.join(MARKINGS)}, got {marking!r}")
        self._connection: http.client.HTTPConnection | None = None
        env = dict(os.environ)
        env.pop("GPREEMPT_AUTO_REQUESTS", None)
        if marking != "auto":
            env["GPREEMPT_AUTO_REQUESTS"] = "0"
        self._dir = tempfile.TemporaryDirectory(prefix="gpb-http-")
        port_file = Path(self._dir.name) / "port"
        argv = [sys.executable, "-m", "gpreempt.bench.http_server", "--fn", fn]
        argv += ["--port-file", str(port_file)] + (["--by-hand"] if marking == "hand" else [])
        self.process = subprocess.Popen(argv, env=env)
        atexit.register(self.close)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the HTTP server did not start ({' '.join(argv)})")
            time.sleep(0.05)
        self.port = int(port_file.read_text())

    def request(self) -> bytes:
        """One ``POST /infer``; its answer."""
        if self._connection is None:
            self._connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        self._connection.request("POST", "/infer", body=b"{}")
        response = self._connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"the HTTP server answered {response.status}: {body[:200]!r}")
        return body

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._dir.cleanup()


def start_client(fn: str, marking: str) -> Callable[[], bytes]:
    """Start a server of handler ``fn`` (``MODULE:FACTORY``) marked as ``marking`` says
    (:data:`MARKINGS`); returns the handler that sends it one request."""
    return HttpClient(fn, marking).request


if __name__ == "__main__":
    sys.exit(serve_main())
