"""The gate's build cache: never another user's, and a held build lock costs a bounded wait
(docs/robustness.md)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from gpreempt.client.gate import build


def test_a_cache_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(build.NativeGateUnavailable, match="private directory"):
        build.check_private(shared)
    os.chmod(shared, 0o700)
    build.check_private(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another user's")
def test_a_cache_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)
    with pytest.raises(build.NativeGateUnavailable, match="uid 65534"):
        build.check_private(planted)


def test_a_held_build_lock_costs_a_bounded_wait(tmp_path: Path) -> None:
    """A trainer stopped while building held the lock: a high task's import waited 20.7 s."""
    holder = os.open(tmp_path / "build.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    pid = os.fork()
    if pid == 0:  # another open file description: the lock conflicts as with another process
        start = time.monotonic()
        with build._building(tmp_path) as held:
            os._exit(0 if not held and time.monotonic() - start < 3 * build.LOCK_WAIT_S else 1)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(holder)
