"""The control block: the activity rule and read-only watch views."""

from __future__ import annotations

import pytest

from gpreempt.control_block import ControlBlock


def test_explicit_requests_take_precedence_over_automatic_activity() -> None:
    block = ControlBlock.create()
    try:
        block.set_auto_active(True)
        assert block.is_active()  # automatic activity alone counts
        block.set_requests(1)
        block.set_requests(0)
        assert not block.is_active()  # once hinted, only open requests count
        block.set_requests(1)
        assert block.is_active()
    finally:
        block.close()


def test_a_scope_that_does_not_hint_adds_to_automatic_activity() -> None:
    """A marker of a part of each request (generate) leaves the launches counting, before,
    during and after its scopes, until a scope that hints (request()) is used."""
    block = ControlBlock.create()
    try:
        block.set_requests(1, hint=False)
        block.set_requests(0)
        assert not block.hinted
        block.set_auto_active(True)
        assert block.is_active()  # its launches still count
        block.set_requests(1)
        block.set_requests(0)
        assert block.hinted and not block.is_active()
    finally:
        block.close()


def test_a_hinting_scope_inside_one_that_does_not_still_hints() -> None:
    """request() entered while a generate call's mark is open: the count stays raised, and
    from then on the process's requests alone count."""
    import types

    from gpreempt.client.linger import PythonScopes
    from gpreempt.client.session import Session

    block = ControlBlock.create()
    # the Python count (test_native_scopes.py: the native one)
    scopes = PythonScopes(block, 0.0)
    current = types.SimpleNamespace(scopes=scopes, warm_requests=False, gate=None)
    try:
        Session.enter_request(current, hint=False)  # type: ignore[arg-type]
        assert block.is_active() and not block.hinted
        Session.enter_request(current)  # type: ignore[arg-type]
        assert block.hinted and scopes.open == 2
        Session.exit_request(current)  # type: ignore[arg-type]
        Session.exit_request(current)  # type: ignore[arg-type]
        block.set_auto_active(True)
        assert not block.is_active()
    finally:
        block.close()


def test_a_watch_view_is_read_only_and_follows_the_activity_rule() -> None:
    import mmap
    import os

    from gpreempt.control import SIZE, ActivityView

    block = ControlBlock.create()
    fd = block.read_only_fd()
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(fd, SIZE)  # writable mapping of a read-only descriptor
        view = ActivityView(fd)
        assert not view.is_active()
        block.set_auto_active(True)
        assert view.is_active()  # automatic activity counts until request() is used
        block.set_requests(1)
        block.set_requests(0)
        assert not view.is_active()  # hinted: requests alone count
        block.set_requests(2)
        assert view.is_active()
        block.clear_activity()  # what the daemon does when the owner goes away
        assert not view.is_active()
        view.close()
        view.close()  # twice is harmless
    finally:
        os.close(fd)
        block.close()


def test_each_rise_of_the_activity_words_bumps_the_epoch_and_nothing_else_does() -> None:
    block = ControlBlock.create()
    try:
        assert block.activity_epoch == 0 and block.barrier_leaks == 0
        block.set_requests(1)
        block.set_requests(2)  # still raised: the same epoch
        assert block.activity_epoch == 1
        block.set_requests(0)
        block.set_auto_active(True)
        block.set_auto_active(True)
        assert block.activity_epoch == 2
        block.set_auto_active(False)
        block.clear_activity()
        assert block.activity_epoch == 2
        block.set_requests(1)
        assert block.activity_epoch == 3
    finally:
        block.close()


def test_status_sums_the_driver_level_gates_waits_and_shows_the_largest_launch_cost() -> None:
    """What the driver-level gates of a task's processes write into their blocks (C++ side:
    driver_marks.cpp, driver_verify.cpp) reaches ``gpreempt status --json``: bound waits and
    the barriers the GPU-side check dated summed over its processes, the GPU time per launch
    the barriers are spaced by as the largest of theirs."""
    from gpreempt.control import (
        OFF_BARRIERS_CHECKED,
        OFF_DRIVER_BOUND_WAITS,
        OFF_DRIVER_NS_PER_LAUNCH,
    )
    from gpreempt.daemon.task import Task, gate_status
    from gpreempt.daemon.task_identity import TaskIdentity

    blocks = [ControlBlock.create(), ControlBlock.create()]
    try:
        for block, ns, waits in zip(blocks, (35_000, 5_000), (2, 1), strict=True):
            block._set32(OFF_DRIVER_NS_PER_LAUNCH, ns)
            block._set32(OFF_DRIVER_BOUND_WAITS, waits)
            block._set32(OFF_BARRIERS_CHECKED, 10 * waits)

        identity = TaskIdentity(1, 10, None, 0, 0, "trainer", 10, (0,), "auto")
        status = gate_status(Task(identity, controls={10: blocks[0], 11: blocks[1]}))
        assert status is not None
        assert status["driver_bound_waits"] == 3
        assert status["barriers_checked"] == 30 and status["barrier_leaks"] == 0

        assert status["driver_us_per_launch"] == pytest.approx(35.0)
        assert blocks[1].stats().driver_us_per_launch == pytest.approx(5.0)
    finally:
        for block in blocks:
            block.close()


@pytest.mark.parametrize(
    ("word", "asleep", "paced", "detached"),
    [(0, False, False, False), (1, True, False, False), (2, False, True, False),
     (3, True, False, True)],
)  # fmt: skip
def test_status_tells_an_asleep_paced_or_detached_driver_level_gate(
    word: int, asleep: bool, paced: bool, detached: bool
) -> None:
    """The ``driver_asleep`` word (C++: callback_mode.h's Mode) as ``gpreempt status`` shows
    it: a detached gate (CUPTI let go) is asleep too."""
    from gpreempt.control import OFF_DRIVER_ASLEEP
    from gpreempt.daemon.task import Task, gate_status
    from gpreempt.daemon.task_identity import TaskIdentity

    block = ControlBlock.create()
    try:
        block._set32(OFF_DRIVER_ASLEEP, word)
        identity = TaskIdentity(1, 10, None, 0, 0, "server", 10, (0,), "auto")
        status = gate_status(Task(identity, controls={10: block}))
        assert status is not None
        got = (status["driver_asleep"], status["driver_paced"], status["driver_detached"])
        assert got == (asleep, paced, detached)
    finally:
        block.close()
