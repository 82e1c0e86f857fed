"""Per-user caps of a shared daemon cover every setting that decides what happens to other
users' tasks, and hold for tasks a restarted daemon registers again (docs/robustness.md)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from conftest import Daemon
from hostile import NOBODY, as_user, needs_root, sleepers

from gpreempt.client.connection import DaemonClient


@needs_root
def test_users_may_not_ask_for_a_share_or_slice_that_starves_others(runtime_dir: Path) -> None:
    os.chmod(runtime_dir, 0o755)
    daemon = Daemon(runtime_dir, "--shared", "--policy", "share")
    try:
        with sleepers(3, user=NOBODY) as procs:

            def try_settings() -> str:
                outcomes = []
                asks = ({"min_share": 1.0}, {"timeslice_ms": 600000.0}, {"min_share": 0.3})
                with DaemonClient.connect(runtime_dir) as client:
                    for proc, ask in zip(procs, asks, strict=True):
                        try:
                            client.register(proc.pid, priority="low", **ask)
                            outcomes.append("ok")
                        except Exception as exc:  # noqa: BLE001
                            outcomes.append(f"{type(exc).__name__} {exc}")
                return "\n".join(outcomes)

            lines = as_user(NOBODY, try_settings).splitlines()
        assert lines[0].startswith("PermissionDenied") and "--min-share" in lines[0]
        assert lines[1].startswith("PermissionDenied") and "--timeslice-ms" in lines[1]
        assert lines[2] == "ok"
    finally:
        daemon.stop()


@needs_root
def test_a_restarted_daemon_applies_its_ceiling_to_persisted_tasks(runtime_dir: Path) -> None:
    os.chmod(runtime_dir, 0o755)
    first = Daemon(runtime_dir, "--shared", "--max-user-priority", "normal")
    with sleepers(1, user=NOBODY) as (proc,):
        try:

            def attach() -> str:
                with DaemonClient.connect(runtime_dir) as client:
                    client.register(proc.pid, priority="normal", name="persisted")
                return "ok"

            assert as_user(NOBODY, attach) == "ok"
        finally:
            first.stop(signal.SIGKILL)
        second = Daemon(runtime_dir, "--shared", "--max-user-priority", "low")
        try:
            with DaemonClient.connect(runtime_dir) as client:
                (task,) = client.status()["tasks"]
            assert task["name"] == "persisted" and task["priority_name"] == "low"
        finally:
            second.stop()
