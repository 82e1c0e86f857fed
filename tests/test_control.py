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
