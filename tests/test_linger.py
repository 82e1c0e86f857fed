"""Requests that linger: the ``requests`` word stays raised a moment after the last one ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import Daemon, gp_env

from gpreempt.client.linger import Linger
from gpreempt.config import ENV_LINGER_MS, request_linger_ms
from gpreempt.control_block import ControlBlock
from gpreempt.errors import UsageError


def _linger(seconds: float) -> tuple[Linger, threading.Lock, list[float]]:
    lock = threading.Lock()
    dropped: list[float] = []
    return Linger(seconds, lambda: dropped.append(time.monotonic()), lock), lock, dropped


def test_the_word_drops_once_the_linger_has_passed_with_no_new_request() -> None:
    linger, lock, dropped = _linger(0.02)
    with lock:
        began = time.monotonic()
        linger.arm()
    assert dropped == []  # not at once
    deadline = time.monotonic() + 5
    while not dropped and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(dropped) == 1 and dropped[0] - began >= 0.02
    assert (linger.releases, linger.bridged) == (1, 0)


def test_a_request_within_the_linger_keeps_the_word_raised() -> None:
    linger, lock, dropped = _linger(0.5)
    with lock:
        linger.arm()
    with lock:
        assert linger.cancel()  # still raised: the new request writes nothing
        assert not linger.cancel()  # nothing pending any more
    time.sleep(0.7)
    assert dropped == [] and linger.bridged == 1
    with lock:  # armed again: it drops again, once
        linger.arm()
        linger.arm()
    deadline = time.monotonic() + 5
    while not dropped and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(dropped) == 1


def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Linger(-0.001, lambda: None, threading.Lock())


@pytest.mark.parametrize(("raw", "expected"), [(None, 0.05), ("", 0.05), ("0", 0.0), ("2.5", 2.5)])
def test_the_linger_setting(monkeypatch, raw, expected) -> None:
    if raw is None:
        monkeypatch.delenv(ENV_LINGER_MS, raising=False)
    else:
        monkeypatch.setenv(ENV_LINGER_MS, raw)
    assert request_linger_ms() == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_bad_linger_setting_says_what_is_wrong(monkeypatch, raw) -> None:
    monkeypatch.setenv(ENV_LINGER_MS, raw)
    with pytest.raises(UsageError, match=ENV_LINGER_MS):
        request_linger_ms()


def test_gpreempt_run_refuses_a_bad_linger_before_starting_the_command(tmp_path) -> None:
    marker = tmp_path / "ran"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpreempt",
            "run",
            "--",
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w')",
        ],
        env={**gp_env(tmp_path / "rt"), ENV_LINGER_MS: "soon"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert ENV_LINGER_MS in result.stderr and "milliseconds" in result.stderr
    assert not marker.exists()


_SERVER = textwrap.dedent(
    """
    import json, os, sys, time
    import gpreempt
    from gpreempt.client import session
    from gpreempt.client.native_scopes import NativeScopes

    current = session.current()
    word = lambda: current.control.stats().requests
    log = os.path.join(os.environ["GPREEMPT_RUNTIME_DIR"], "events.jsonl")

    def kinds():
        # what the daemon logged of this task so far (a line being written is skipped)
        seen = []
        try:
            lines = open(log).read().splitlines()
        except OSError:
            return seen
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("task") == "server":
                seen.append(event["event"])
        return seen

    def quiet(seconds):
        # at most ``seconds``: until the word has dropped and the daemon has seen the server
        # go idle (as often as active), so that a next request is a new activation
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if word() == 0 and kinds().count("active") == kinds().count("idle"):
                return
            time.sleep(0.01)

    with gpreempt.request():
        pass
    right_after = word()
    quiet(1.0)
    later = word()
    for _ in range(5):  # back to back: one activity for the daemon
        with gpreempt.request():
            pass
    quiet(1.0)
    counter = current.scopes
    print(json.dumps({"right_after": right_after, "later": later, "last": word(),
                      "bridged": counter.bridged, "releases": counter.releases,
                      "native": isinstance(counter, NativeScopes)}))
    """
)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("linger_ms", ["200", "0"])
def test_a_server_stays_active_between_back_to_back_requests(tmp_path, linger_ms, native) -> None:
    """End to end: the word, and what the daemon saw, with and without a linger, counted by
    the native counter and, where it cannot be built (no compiler), by the Python linger."""
    if native and shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    daemon = Daemon(runtime)
    try:
        env = {**gp_env(runtime), ENV_LINGER_MS: linger_ms, "GPREEMPT_GATE": "0"}
        if not native:  # an empty cache and no compiler: nothing to load
            env.update(CXX="no-such-compiler", GPREEMPT_CACHE_DIR=str(tmp_path / "cache"))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpreempt",
                "run",
                "--priority",
                "high",
                "--name",
                "server",
                "--",
                sys.executable,
                "-c",
                _SERVER,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        daemon.stop()
    events = [json.loads(line) for line in (runtime / "events.jsonl").read_text().splitlines()]
    activations = [e for e in events if e["event"] == "active" and e["task"] == "server"]
    assert seen["native"] is native
    assert (seen["later"], seen["last"]) == (0, 0)  # it always drops in the end
    if linger_ms == "0":
        assert (seen["right_after"], seen["bridged"], seen["releases"]) == (0, 0, 0)
    else:
        assert seen["right_after"] == 1
        assert seen["bridged"] == 4 and seen["releases"] == 2
        assert len(activations) == 2, activations  # the five back to back were one


def test_a_block_kept_mapped_stays_readable_after_close() -> None:
    """Stream barriers read the gate's own block on the GPU: its page stays mapped for good,
    so no later mapping can take its address (and the driver's registration of it)."""
    import ctypes

    block = ControlBlock.create()
    block.set_gate(True)
    address = block.address
    block.keep_mapped()
    block.close()
    assert ctypes.c_uint32.from_address(address).value == 1
    with pytest.raises(OSError):
        os.fstat(block.memfd)  # the descriptors are closed all the same
