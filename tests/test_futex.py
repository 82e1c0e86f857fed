"""The futex wake-up behind the gate word, across processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpreempt import futex
from gpreempt.control_block import ControlBlock

_FUTEX_WAITER = """
import ctypes, mmap, sys, time
from gpreempt import futex
fd = int(sys.argv[1])
block = mmap.mmap(fd, 64)
address = ctypes.addressof(ctypes.c_char.from_buffer(block))
print("waiting", flush=True)
start = time.monotonic()
futex.wait(address, 1, 20.0)
print(f"{time.monotonic() - start:.3f}", flush=True)
"""


@pytest.mark.skipif(not futex.available(), reason="no futex system call known on this machine")
def test_opening_a_gate_wakes_a_waiter_in_another_process() -> None:
    block = ControlBlock.create()
    block.set_gate(True)
    child = subprocess.Popen(
        [sys.executable, "-c", _FUTEX_WAITER, str(block.memfd)],
        pass_fds=(block.memfd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # let it reach the wait
        block.set_gate(False)
        waited = float(child.stdout.readline())
        assert waited < 5.0  # woken by the open, not by its 20 s timeout
    finally:
        child.kill()
        child.wait()
        block.close()


@pytest.mark.skipif(not futex.available(), reason="no futex system call known on this machine")
def test_futex_wait_times_out_and_returns_at_once_if_the_word_differs() -> None:
    block = ControlBlock.create()
    try:
        block.set_gate(True)
        start = time.monotonic()
        futex.wait(block.address, 1, 0.05)
        assert 0.04 < time.monotonic() - start < 2.0
        start = time.monotonic()
        futex.wait(block.address, 0, 5.0)  # the word is 1, not 0
        assert time.monotonic() - start < 1.0
    finally:
        block.close()


def test_futex_wake_without_waiters_or_address_is_harmless() -> None:
    block = ControlBlock.create()
    try:
        assert futex.wake(block.address) == 0
        assert futex.wake(0) == 0
    finally:
        block.close()
