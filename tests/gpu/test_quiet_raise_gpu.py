"""Quiet raises on a real GPU: a server whose every less important task holds itself on its
words leaves the doorbell of a raise to its request counter's helper, and the trainer beside it
stands still all the same.

The trainer (CuPy work in a process that also imports torch) runs under ``gpreempt run
--priority low`` with nothing else set; its driver-level gate watches the server's block and
its stream barriers wait on the server's ``requests`` word. The daemon then marks the server
quiet (``status``: the server's ``gate.quiet``), and a request's raise no longer rings the
daemon from the server's thread (the counter's ``deferred``). The trainer's progress on the GPU
must stand still for the whole of a request all the same, with no leak.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    NVIDIA_GPU,
    progress_count,
    spawn,
    stands_still_through_a_request,
    stop_all,
    task_named,
    wait_for,
)

PROGRAMS = Path(__file__).parent / "programs"

pytestmark = NVIDIA_GPU

# A server that opens a short request every 0.1 s (its first hint rings at once; its counter's
# helper keeps polling between them) until told, then one of `seconds`, and writes its request
# counter's figures.
SERVER = r"""
import json, pathlib, sys, time
import gpreempt
from gpreempt.client import session
from gpreempt.client.native_scopes import NativeScopes
go, seconds, out = pathlib.Path(sys.argv[1]), float(sys.argv[2]), pathlib.Path(sys.argv[3])
while not go.exists():
    with gpreempt.request():
        time.sleep(0.002)
    time.sleep(0.1)
with gpreempt.request():
    time.sleep(seconds)
scopes = session.current().scopes
native = isinstance(scopes, NativeScopes)
out.write_text(json.dumps({"native": native, "deferred": scopes.deferred if native else 0}))
time.sleep(120)
"""


def test_a_quiet_raise_holds_the_trainer_without_ringing_from_the_request(
    daemon, runtime_dir, tmp_path
):
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    progress, go, out = tmp_path / "progress", tmp_path / "go", tmp_path / "server.json"
    server = spawn(
        runtime_dir, "run", "--priority", "high", "--name", "server", "--",
        sys.executable, "-c", SERVER, str(go), "2.0", str(out),
    )  # fmt: skip
    trainer = spawn(
        runtime_dir, "run", "--priority", "low", "--name", "trainer", "--",
        sys.executable, str(PROGRAMS / "mixed_worker.py"), str(progress), "cupy", "90",
    )  # fmt: skip
    try:
        assert wait_for(lambda: progress_count(progress) > 0, 100), "no progress"

        def quiet() -> bool:
            server_task = task_named(runtime_dir, "server") or {}
            return bool((server_task.get("gate") or {}).get("quiet"))

        assert wait_for(quiet, 20), task_named(runtime_dir, "server")
        time.sleep(1.0)
        held_to, _ = stands_still_through_a_request(runtime_dir, go, progress)
        assert wait_for(out.exists, 10), "the server wrote nothing"
        figures = json.loads(out.read_text())
        assert figures["native"] and figures["deferred"] >= 2, figures
        assert wait_for(lambda: progress_count(progress) > held_to, 20), "no progress after it"
    finally:
        stop_all(trainer, server)
