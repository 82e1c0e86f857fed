"""The Python fallback gate: the C++ gate's algorithm as a ``TorchDispatchMode``.

Used where the extension cannot be built (no compiler). It does what the C++ hook in
``csrc/operator_gate*`` does -- wait while the gate is closed or a watched task is active, bound the
work in flight, publish the process's own GPU activity -- at a much higher cost per operator
(a Python call each, ~1000x the C++ hook), and only for the thread that installed it (and the
autograd threads serving it). It counts every operator at the average cost, puts no stream
barriers and never sleeps.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
import time
from typing import Any

from ... import futex
from ...control import (
    DRIVER_ON,
    OFF_AUTO_ACTIVE,
    OFF_DRIVER_GATE,
    OFF_GATE_CLOSED,
    OFF_GATE_INSTALLED,
    OFF_GENERATION,
    OFF_LAUNCHES,
    OFF_WAIT_NS,
    OFF_WAITS,
    OFF_WINDOW,
    OFF_WINDOW_SHARE_US,
    SIZE,
    released_by_watch,
    words_want_gpu,
)
from ...control_block import ControlBlock
from .config import GateConfig
from .fallback_inflight import InflightEvents
from .torch_patches import cuda_initialized

#: Longest sleep at a gate the daemon closed (it wakes the sleepers as it opens the gate).
CLOSED_SLEEP_S = 0.001


class ControlWords:
    """Typed views of the control block's words, for the Python fallback."""

    def __init__(self, control: ControlBlock) -> None:
        base = control.address
        self.closed = ctypes.c_uint32.from_address(base + OFF_GATE_CLOSED)
        self.generation = ctypes.c_uint32.from_address(base + OFF_GENERATION)
        self.launches = ctypes.c_uint64.from_address(base + OFF_LAUNCHES)
        self.waits = ctypes.c_uint64.from_address(base + OFF_WAITS)
        self.wait_ns = ctypes.c_uint64.from_address(base + OFF_WAIT_NS)
        self.window = ctypes.c_uint32.from_address(base + OFF_WINDOW)
        self.installed = ctypes.c_uint32.from_address(base + OFF_GATE_INSTALLED)
        self.window_share_us = ctypes.c_uint32.from_address(base + OFF_WINDOW_SHARE_US)
        self.auto_active = ctypes.c_uint32.from_address(base + OFF_AUTO_ACTIVE)
        self.driver_gate = ctypes.c_uint32.from_address(base + OFF_DRIVER_GATE)

    def handed_now(self, handed: bool) -> bool:
        """Whether the driver-level gate tells the activity now: ``handed`` to it (the gate's
        ``hand_activity``) and it holds CUPTI. While a profiler holds CUPTI the launches go
        unseen, and the operator gate tells the activity again, as it sees it."""
        return handed and self.driver_gate.value == DRIVER_ON

    def left_active(self) -> bool:
        """The activity word raised while the driver-level gate does not hold CUPTI: a rise it
        left as a profiler took CUPTI, which the operator gate adopts (to drop it when idle)."""
        return self.driver_gate.value != DRIVER_ON and self.auto_active.value != 0


def wait_for_streams(torch: Any, streams: list[Any], lock: Any) -> None:
    """Wait until the work queued so far on each of ``streams`` has completed: an event
    recorded behind it (under ``lock``, which guards the list), then polled."""
    with lock:
        events = [torch.cuda.Event() for _ in streams]
        for event, stream in zip(events, streams, strict=True):
            event.record(stream)
    while not all(event.query() for event in events):
        time.sleep(50e-6)


class PythonGate:
    """The fallback: a TorchDispatchMode doing what the C++ hook does, ~1000x slower per op.

    Dispatch modes are per thread: it gates the installing thread and the autograd threads
    serving it, not other threads. Uninstall from the installing thread.
    """

    def __init__(self, control: ControlBlock, config: GateConfig) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        self._torch = torch
        self._control = control
        self._ctl = ControlWords(control)
        self._config = config
        self._thread_task = threading.local()
        self._default_task_word: Any = None
        self._watched: tuple[Any, ...] = ()  # u32 arrays over read-only control blocks
        self._watch_version = 0
        self._counter = itertools.count(1)
        self._launches = 0
        self._next_mark = config.record_every
        self._waits = 0
        self._wait_ns = 0
        self._inflight = InflightEvents()
        self._window = config.window_launches
        self._tight = config.mode == "tight"
        self._last_closed = -1e18
        self._seen_generation = self._ctl.generation.value
        self._device_live = cuda_initialized(torch)
        self._captures = 0
        self._lock = threading.RLock()
        self._active = False
        self._handed = False  # the driver-level gate tells the activity (ControlWords.handed_now)
        self._activations = 0
        self._streams: list[Any] = []
        self._wake = threading.Event()
        self._stop = False
        self._pid = os.getpid()
        self._enabled = True
        self._installed = True
        self._ctl.window.value = config.window_launches
        gate = self

        class _GateMode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                if gate._enabled:
                    gate.before_launch()
                return func(*args, **(kwargs or {}))

        self._mode = _GateMode()
        self._mode.__enter__()
        self._mode_thread = threading.get_ident()
        self._thread: threading.Thread | None = None
        if config.auto_activity:
            self._thread = threading.Thread(
                target=self._activity_loop, name="gpreempt-gate-activity", daemon=True
            )
            self._thread.start()
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        self._ctl.installed.value = 1

    # -- per operator --------------------------------------------------------------------
    def before_launch(self) -> None:
        n = next(self._counter)
        self._launches = n
        if self._must_wait(self._ctl.closed.value):
            self._wait_open(self._ctl.closed, watch=True, woken=True)
        task_word = getattr(self._thread_task, "word", None) or self._default_task_word
        if task_word is not None and task_word.value:
            self._wait_open(task_word)
        if getattr(self._thread_task, "unbounded", False):
            return
        if self._config.auto_activity and not self._active:
            self._mark_active()
            self._segment(n, force=True)
        elif n >= self._next_mark:
            self._segment(n, force=False)

    def bind_thread(self, word_address: int, unbounded: bool) -> None:
        if word_address:
            self._thread_task.word = ctypes.c_uint32.from_address(word_address)
            self._thread_task.unbounded = unbounded
        else:
            self._thread_task.word = None
            self._thread_task.unbounded = False

    def set_default_task_word(self, word_address: int) -> None:
        self._default_task_word = (
            ctypes.c_uint32.from_address(word_address) if word_address else None
        )

    def watch(self, addresses: list[int], version: int) -> None:
        words = ctypes.c_uint32 * (SIZE // 4)
        watched = tuple(words.from_address(a) for a in addresses if a)
        self._watched, self._watch_version = watched, version if watched else 0

    def _watched_active(self) -> bool:
        return any(words_want_gpu(words) for words in self._watched)

    def _closed_while_watched(self, closed: int) -> bool:
        """``closed`` holds the gate only while the watched tasks are active."""
        return released_by_watch(closed, self._watch_version, False)

    def _must_wait(self, closed: int) -> bool:
        """Whether the gate's own word ``closed`` (or the watched tasks) stop the launch."""
        if closed and not self._closed_while_watched(closed):
            return True
        return self._watched_active()

    def _wait_open(self, word: Any, watch: bool = False, woken: bool = False) -> None:
        """Wait while ``word`` is set or, with ``watch``, a watched task is active. ``woken``:
        whoever opens ``word`` wakes its waiters (the daemon's gate_closed), so a closed word
        is slept on for CLOSED_SLEEP_S at a time rather than polled."""
        if self._captures > 0 or self._capturing():
            return
        start = time.monotonic_ns()
        self._last_closed = start
        self._waits += 1
        self._ctl.waits.value = self._waits
        while self._installed and (self._must_wait(word.value) if watch else word.value):
            closed = word.value
            if woken and closed and not (watch and self._closed_while_watched(closed)):
                futex.wait(ctypes.addressof(word), closed, CLOSED_SLEEP_S)
            else:
                time.sleep(self._config.poll_us / 1e6)
        end = time.monotonic_ns()
        self._last_closed = end
        self._wait_ns += end - start
        self._ctl.wait_ns.value = self._wait_ns

    def _capturing(self) -> bool:
        try:
            return bool(self._device_live and self._torch.cuda.is_current_stream_capturing())
        except Exception:
            return False

    def _is_tight(self, now: int) -> bool:
        if self._config.mode != "adaptive":
            return self._config.mode == "tight"
        if self._ctl.window_share_us.value:  # someone more important is registered
            return True
        return now - self._last_closed < self._config.tight_hold_ms * 1e6

    def _segment(self, n: int, force: bool) -> None:
        with self._lock:
            if not force and n < self._next_mark:
                return
            now = time.monotonic_ns()
            generation = self._ctl.generation.value
            if generation != self._seen_generation:
                self._seen_generation = generation
                self._last_closed = now
            self._tight = self._is_tight(now)
            cfg = self._config
            self._next_mark = n + (cfg.record_every if self._tight else cfg.open_record_every)
            self._ctl.launches.value = n
            if not self._device_live or self._captures > 0 or self._capturing():
                return
            cuda = self._torch.cuda
            stream = cuda.current_stream()
            if stream not in self._streams:
                self._streams = (self._streams + [stream])[-16:]
            if not cfg.bound:
                return
            self._inflight.record(cuda, stream, n)
            by_count = cfg.window_launches if self._tight else cfg.open_window_launches
            window_ms = cfg.window_ms if self._tight else cfg.open_window_ms
            share_us = self._ctl.window_share_us.value if self._tight else 0
            if share_us:  # the daemon's share of this GPU's in-flight budget
                share_ms = share_us / 1000
                window_ms = min(window_ms, share_ms) if window_ms > 0 else share_ms
            window = by_count
            per_launch = self._inflight.ns_per_launch
            if window_ms > 0 and per_launch > 0:
                window = min(window, int(window_ms * 1e6 / per_launch))
            if self._tight and window // 2 < cfg.record_every:
                self._next_mark = n + max(1, window // 2)
            self._window = window
            self._ctl.window.value = min(window, 0xFFFFFFFF)
            self._inflight.wait_within(n, window)

    # -- activity ------------------------------------------------------------------------
    def _publish(self) -> None:
        if not self._ctl.handed_now(self._handed):
            self._control.set_auto_active(self._active)

    def hand_activity(self, handed: bool) -> bool:
        with self._lock:
            self._handed = handed
            self._publish()  # its own activity again where it is not handed
        return True

    def _mark_active(self) -> None:
        with self._lock:
            if self._active or self._ctl.handed_now(self._handed):
                return
            self._active = True
            self._activations += 1
            self._publish()
        self._wake.set()

    def _wait_for_gpu(self) -> None:
        if self._device_live and self._captures == 0 and self._streams:
            wait_for_streams(self._torch, self._streams, self._lock)

    def _activity_loop(self) -> None:
        grace = self._config.idle_grace_ms / 1e3
        poll = max(50e-6, min(grace / 4, 500e-6))
        while not self._stop:
            if not self._active:
                self._wake.wait(0.2)
                self._wake.clear()
                with self._lock:  # a rise the driver-level gate left to a profiler, adopted
                    self._active |= self._handed and self._ctl.left_active()
                continue
            seen = self._launches
            quiet_since: float | None = None
            while not self._stop:
                time.sleep(poll)
                if self._launches != seen:
                    seen = self._launches
                    quiet_since = None
                    continue
                self._wait_for_gpu()
                if self._launches != seen:
                    continue
                now = time.monotonic()
                quiet_since = quiet_since or now
                if now - quiet_since < grace:
                    continue
                with self._lock:
                    if self._launches != seen:
                        continue
                    self._active = False
                    self._publish()
                break

    # -- control -------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        self._enabled = False
        self._installed = False
        self._thread = None

    def uninstall(self) -> None:
        if not self._installed and os.getpid() != self._pid:
            return
        self._installed = False
        self._enabled = False
        self._stop = True
        self._wake.set()
        if threading.get_ident() == self._mode_thread:
            # if another mode was pushed on top, ours stays, as a pass-through
            with contextlib.suppress(Exception):
                self._mode.__exit__(None, None, None)
        # from another thread the mode stays on the installing thread's stack, as a pass-through
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._active:
            self._active = False
            self._publish()
        self._ctl.installed.value = 0

    def stats(self) -> dict[str, Any]:
        return {
            "launches": self._launches,
            "waits": self._waits,
            "wait_seconds": self._wait_ns / 1e9,
            "bound_waits": self._inflight.bound_waits,
            "bound_wait_seconds": self._inflight.bound_wait_ns / 1e9,
            "events_recorded": self._inflight.recorded,
            "window": self._window,
            "tight": self._tight,
            "auto_active": self._active,
            "activations": self._activations,
            "device_live": self._device_live,
            "captures": self._captures,
            "events_in_flight": len(self._inflight.fifo),
            "streams": len(self._streams),
            "us_per_launch": self._inflight.ns_per_launch / 1e3,
            "error": None,
            "forked_child": os.getpid() != self._pid,
        }

    def drain(self) -> None:
        if self._device_live and self._captures == 0:
            with self._lock:
                for stream in self._streams:
                    stream.synchronize()
                self._inflight.reap()

    def set_device_live(self, live: bool) -> None:
        self._device_live = live

    def capture_begin(self) -> None:
        self._captures += 1

    def capture_end(self) -> None:
        self._captures = max(0, self._captures - 1)
