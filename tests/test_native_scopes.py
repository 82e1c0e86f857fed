"""The native request counter: the ``requests`` word, its linger, the doorbell, no wake-ups."""

from __future__ import annotations

import os
import select
import shutil
import time

import pytest

from gpreempt.client.gate.scopes_build import ScopesUnavailable, build
from gpreempt.client.native_scopes import NativeScopes
from gpreempt.control_block import ControlBlock

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")


@pytest.fixture
def block():
    control = ControlBlock.create()
    control.keep_mapped()  # the helper thread writes it for the process's life
    yield control
    control.close()


def _rang(control: ControlBlock) -> bool:
    """Whether the doorbell rang since the last look (and reset it)."""
    if not select.select([control.doorbell], [], [], 0)[0]:
        return False
    os.eventfd_read(control.doorbell)
    return True


def _wait_for(predicate, seconds: float = 5.0) -> float:
    """Seconds until ``predicate()`` held; fails after ``seconds``."""
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < seconds, "timed out"
        time.sleep(0.0005)
    return time.monotonic() - began


def test_a_request_raises_the_word_and_it_drops_after_the_linger(block) -> None:
    scopes = NativeScopes(block.address, block.doorbell, 0.02)
    assert scopes.enter(True)
    stats = block.stats()
    assert (stats.requests, block.hinted, block.activity_epoch) == (1, True, 1)
    assert _rang(block)
    began = time.monotonic()
    scopes.exit()
    assert block.stats().requests == 1  # still raised: it lingers
    _wait_for(lambda: block.stats().requests == 0)
    assert time.monotonic() - began >= 0.02
    assert _rang(block)  # the daemon hears of the drop
    assert (scopes.releases, scopes.bridged) == (1, 0)


def test_a_request_within_the_linger_is_bridged_and_rings_nobody(block) -> None:
    scopes = NativeScopes(block.address, block.doorbell, 0.5)
    scopes.enter(True)
    scopes.exit()
    _rang(block)
    assert not scopes.enter(True)  # the word still stands: nothing to write
    assert not _rang(block)
    assert block.activity_epoch == 1  # one activity for the daemon and the gates
    scopes.exit()
    assert (scopes.bridged, scopes.releases) == (1, 0)


def test_nested_scopes_hold_the_word_until_the_last_closes(block) -> None:
    scopes = NativeScopes(block.address, block.doorbell, 0.0)
    assert scopes.enter(True)
    assert not scopes.enter(True)
    scopes.exit()
    assert block.stats().requests == 1
    scopes.exit()
    assert block.stats().requests == 0  # no linger: at once
    scopes.exit()  # one too many is ignored
    assert block.stats().requests == 0


def test_a_scope_without_hint_adds_to_what_launches_tell(block) -> None:
    scopes = NativeScopes(block.address, block.doorbell, 0.0)
    scopes.enter(False)
    assert not block.hinted
    scopes.enter(True)  # a hint later still says so, with the word already raised
    assert block.hinted and block.activity_epoch == 1


def test_ends_in_a_busy_period_wake_no_thread(block) -> None:
    """The helper polls while requests are open, so a closing scope only writes a deadline:
    it would have to wake the helper at every end if it did not."""
    scopes = NativeScopes(block.address, block.doorbell, 0.05)
    for _ in range(20):  # back to back, each longer than the helper's slowest poll
        scopes.enter(True)
        time.sleep(0.01)
        scopes.exit()
    assert scopes.bridged == 19
    assert scopes.wakes <= 3  # a busy machine may leave the helper unscheduled a while
    _wait_for(lambda: block.stats().requests == 0)
    assert scopes.releases == 1


def test_a_request_shorter_than_the_last_ones_wakes_the_helper_and_still_drops(block) -> None:
    """The helper sleeps through most of a request, judged by the shortest recent ones: a
    request that ends well before that wakes it, and its word drops after the linger all the
    same."""
    scopes = NativeScopes(block.address, block.doorbell, 0.02)
    for _ in range(4):
        scopes.enter(True)
        time.sleep(0.03)
        scopes.exit()
        _wait_for(lambda: block.stats().requests == 0)
    before = scopes.wakes
    scopes.enter(True)
    time.sleep(0.002)  # the helper waits until about 28 ms into it
    began = time.monotonic()
    scopes.exit()
    assert scopes.wakes == before + 1
    _wait_for(lambda: block.stats().requests == 0, seconds=1.0)
    assert 0.02 <= time.monotonic() - began < 0.5


def test_the_word_drops_after_a_request_the_helper_did_not_see_open(block) -> None:
    scopes = NativeScopes(block.address, block.doorbell, 0.01)
    scopes.enter(True)
    scopes.exit()  # at once: the helper, polling slowly, had no time to see it open
    _wait_for(lambda: block.stats().requests == 0)
    assert scopes.releases == 1


def test_a_helper_asleep_after_a_long_quiet_is_woken_by_the_end(block) -> None:
    scopes = NativeScopes(block.address, block.doorbell, 0.01)
    time.sleep(2.3)  # the helper stops polling 2 s after the last request
    scopes.enter(True)
    scopes.exit()
    assert scopes.wakes == 1
    _wait_for(lambda: block.stats().requests == 0, seconds=1.0)
    assert scopes.releases == 1


def test_a_negative_linger_is_refused(block) -> None:
    with pytest.raises(ValueError, match="negative"):
        NativeScopes(block.address, block.doorbell, -0.001)


def test_without_a_compiler_it_says_why_in_one_line(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GPREEMPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(ScopesUnavailable, match="no C.. compiler"):
        build()


def test_a_failed_build_leaves_its_log(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GPREEMPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(ScopesUnavailable, match="build.log"):
        build()
    assert (tmp_path / "request_scopes" / "build.log").is_file()


def test_a_quiet_block_leaves_the_ring_of_a_raise_to_the_helper(block) -> None:
    """The daemon said that every task this one outranks holds itself on its words: the raise
    writes the word at once and the helper rings at its next poll, off the request's path."""
    scopes = NativeScopes(block.address, block.doorbell, 0.05)
    scopes.enter(True)  # the first hint rings at once: the daemon must learn of it
    scopes.exit()
    _wait_for(lambda: block.stats().requests == 0)
    _rang(block)
    block.set_quiet(True)
    scopes.enter(True)
    assert block.stats().requests == 1 and block.activity_epoch == 2
    _wait_for(lambda: _rang(block), seconds=1.0)  # a poll later
    assert scopes.deferred == 1
    scopes.exit()
    block.set_quiet(False)
    _wait_for(lambda: block.stats().requests == 0)
    _rang(block)
    scopes.enter(True)  # not quiet any more: at once
    assert _rang(block) and scopes.deferred == 1


def test_a_compiler_that_cannot_run_is_said_in_one_line(monkeypatch, tmp_path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    compiler = bin_dir / "cxx"
    compiler.write_bytes(b"\x7fELF not really")  # executable, and no program the kernel runs
    compiler.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("GPREEMPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "cxx")
    with pytest.raises(ScopesUnavailable, match="cannot run .*cxx for the request counter"):
        build()
