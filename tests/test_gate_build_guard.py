"""The gate's build cache: never another user's; a build lock held by a process that builds is
waited for, one held by a stopped or unknown process costs a bounded wait (docs/robustness.md)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
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
        build.LOCK_WAIT_S = 1.0  # the bound's mechanism, not its value (10 s), is tested here
        start = time.monotonic()
        with build._building(tmp_path) as held:
            waited = time.monotonic() - start
            os._exit(0 if not held and 1.0 <= waited < 3.0 else 1)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(holder)


def _wait_in_child(directory: Path, holder: int, lock_wait_s: float) -> int:
    """Fork a loader that takes ``directory``'s build lock (a separate open file description,
    so that the lock conflicts as with another process): exit 0 if it got it, 1 if not. The
    child closes its copy of ``holder``, whose lock would otherwise stay held by it."""
    pid = os.fork()
    if pid == 0:
        os.close(holder)
        build.LOCK_WAIT_S = lock_wait_s
        with build.build_lock(directory, "a test") as held:
            os._exit(0 if held else 1)
    return pid


def _hold(directory: Path, pid: int) -> int:
    """Take ``directory``'s build lock here, its file naming ``pid`` as the holder."""
    holder = os.open(directory / "build.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    os.pwrite(holder, f"{pid}\n".encode(), 0)
    return holder


def test_a_build_lock_held_by_a_running_builder_is_waited_for(tmp_path: Path) -> None:
    """Several processes started at once on a fresh machine: all wait for the first build
    rather than going without the native gate."""
    holder = _hold(tmp_path, os.getpid())  # this process: alive and running
    try:
        child = _wait_in_child(tmp_path, holder, lock_wait_s=0.2)
        time.sleep(1.0)  # five times the wait for an unknown holder
        assert os.waitpid(child, os.WNOHANG) == (0, 0)  # still waiting
    finally:
        os.close(holder)  # the build is done
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "build.lock").read_text().strip() == str(child)  # it names its holder


def test_a_build_lock_held_by_a_stopped_process_is_not_waited_for(tmp_path: Path) -> None:
    stopped = subprocess.Popen(["sleep", "60"])
    os.kill(stopped.pid, signal.SIGSTOP)
    holder = _hold(tmp_path, stopped.pid)
    try:
        start = time.monotonic()
        child = _wait_in_child(tmp_path, holder, lock_wait_s=0.2)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 1  # went without
        assert time.monotonic() - start < 10
    finally:
        os.close(holder)
        stopped.kill()
        stopped.wait()


def test_a_library_is_named_after_what_it_is_built_from(tmp_path: Path) -> None:
    """A changed source, or another include directory, gives a new file name: a cached library
    is never one built from other code."""
    source = tmp_path / "a.cpp"
    source.write_text("int a;\n")
    first = build.library_file_name("libx_", [source], "/usr/include")
    assert first.startswith("libx_") and first.endswith(".so")
    assert build.library_file_name("libx_", [source], "/usr/include") == first
    assert build.library_file_name("libx_", [source], "/opt/include") != first
    source.write_text("int b;\n")
    assert build.library_file_name("libx_", [source], "/usr/include") != first


def test_without_a_compiler_each_part_says_so_with_its_own_error(monkeypatch) -> None:
    class PartUnavailable(RuntimeError):
        pass

    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(PartUnavailable, match="no C.. compiler .'no-such-compiler'.*set CXX"):
        build.cxx_compiler(PartUnavailable)
    monkeypatch.setenv("CXX", "sh")
    assert build.cxx_compiler() == "sh"
