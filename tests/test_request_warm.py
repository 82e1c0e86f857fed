"""Requests that warm the GPU (``GPREEMPT_REQUEST_WARM``): a no-op kernel, once per activation
of the requests word."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import Daemon, gp_env

from gpreempt.config import ENV_LINGER_MS, ENV_REQUEST_WARM, request_warm
from gpreempt.errors import UsageError


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, False), ("", False), ("0", False), ("off", False), ("1", True)]
)
def test_the_warm_setting(monkeypatch, raw, expected) -> None:
    if raw is None:
        monkeypatch.delenv(ENV_REQUEST_WARM, raising=False)
    else:
        monkeypatch.setenv(ENV_REQUEST_WARM, raw)
    assert request_warm() is expected


def test_a_bad_warm_setting_says_what_is_wrong(monkeypatch) -> None:
    monkeypatch.setenv(ENV_REQUEST_WARM, "sometimes")
    with pytest.raises(UsageError, match=ENV_REQUEST_WARM):
        request_warm()


def test_gpreempt_run_refuses_a_bad_warm_setting_before_starting_the_command(tmp_path) -> None:
    marker = tmp_path / "ran"
    command = [sys.executable, "-m", "gpreempt", "run", "--"]
    command += [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    result = subprocess.run(
        command,
        env={**gp_env(tmp_path / "rt"), ENV_REQUEST_WARM: "sometimes"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0 and ENV_REQUEST_WARM in result.stderr
    assert not marker.exists()


_SERVER = textwrap.dedent(
    """
    import json, time
    import gpreempt
    from gpreempt.client import session

    class Gate:  # stands in for the installed gate: counts the warm-ups asked of it
        warmed = 0
        def warm(self):
            Gate.warmed += 1

    current = session.current()
    current.gate = Gate()
    seen = []
    with gpreempt.request():
        with gpreempt.request():  # nested: the word is already raised
            pass
    seen.append(Gate.warmed)
    with gpreempt.request():  # right after: bridged by the linger
        pass
    seen.append(Gate.warmed)
    end = time.monotonic() + 0.5  # the linger has passed (the word dropped): a new activation
    while current.control.stats().requests and time.monotonic() < end:
        time.sleep(0.01)
    with gpreempt.request():
        pass
    seen.append(Gate.warmed)
    print(json.dumps(seen))
    """
)


@pytest.mark.parametrize(("warm", "expected"), [("1", [1, 1, 2]), ("0", [0, 0, 0])])
def test_a_request_warms_once_per_activation(tmp_path, warm, expected) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    daemon = Daemon(runtime)
    try:
        env = {**gp_env(runtime), ENV_REQUEST_WARM: warm, ENV_LINGER_MS: "100"}
        env["GPREEMPT_GATE"] = "0"
        result = subprocess.run(
            [sys.executable, "-m", "gpreempt", "run", "--priority", "high", "--"]
            + [sys.executable, "-c", _SERVER],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        daemon.stop()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_warm_launches_nothing_without_cuda(monkeypatch) -> None:
    """On a machine without a GPU (or before CUDA is initialised) warming launches nothing
    and raises nothing."""
    torch = pytest.importorskip("torch")
    from gpreempt.client import gate as gate_mod
    from gpreempt.control_block import ControlBlock

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process")
    launched: list[int] = []
    monkeypatch.setattr(torch.cuda, "_sleep", launched.append, raising=False)
    block = ControlBlock.create()
    gate = gate_mod.install_gate(block, gate_mod.resolve_config(bound=False, auto_activity=False))
    try:
        gate.warm()
    finally:
        gate.uninstall()
        block.close()
    gate.warm()  # uninstalled: still nothing, no error
    assert launched == []
