"""The process side of a benchmark, free of torch: serve requests at their scheduled times,
train until told to stop, and the file handshake with the harness.

Handshake (all paths given on the command line, so it works under any launcher):

- after warming up, a process writes its *ready file*;
- a server then waits for the *go file* (JSON ``{"t0": unix time}``) and serves arrival
  ``i`` at ``t0 + offset[i]``;
- a trainer trains until its *stop file* appears or it gets SIGTERM;
- each writes its results as JSON to its *out file* (written whole, then renamed).

A server may also grow its working set once, inside one request (:class:`Growth`, the
memory-pressure scenarios): it allocates device memory in chunks through a
:class:`DeviceMemory` and, when out of memory, waits for room up to a deadline.

A request's work is any callable that returns when the answer is ready (one that keeps a list
``gpu_ms``, :data:`GPU_MS`, of its requests' GPU spans has those of the served requests written
beside their times, to tell a request slowed on the GPU from one that started late); a
training step is any callable that returns ``None`` (done when it returns) or an object with
``synchronize()`` (e.g. a ``torch.cuda.Event``), which a helper thread waits on to time-stamp
the step's completion without stalling the training loop.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..errors import UsageError

Handler = Callable[[], Any]
#: The attribute under which a request handler may keep its requests' GPU spans (ms, a list it
#: appends one to per request): the server's results then hold those of the served requests.
GPU_MS = "gpu_ms"


def load_callable(spec: str) -> Callable[..., Any]:
    """``"package.module:name"`` -> the object it names (a user's own workload factory)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FUNCTION, got {spec!r} (e.g. mypkg.bench:make_request)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r} for {spec!r}: {exc}") from None
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no {attr!r}") from None
    if not callable(value):
        raise UsageError(f"{spec!r} is not callable")
    return value


def request_context() -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """``gpreempt.request`` (the "a request is running" hint), or a no-op where it is missing."""
    import gpreempt

    hint = getattr(gpreempt, "request", None)
    return hint if callable(hint) else contextlib.nullcontext


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON to ``path`` atomically (temporary file, then rename)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, target)


def mark_ready(path: str | os.PathLike[str] | None, **info: Any) -> None:
    """Say "warmed up": write the ready file and print a READY line."""
    if path:
        write_json(path, {"t": time.time(), "pid": os.getpid(), **info})
    print(f"READY pid={os.getpid()}", flush=True)


def wait_for_file(path: str | os.PathLike[str], timeout_s: float, poll_s: float = 0.001) -> str:
    """Wait until ``path`` exists and return its text; UsageError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    target = Path(path)
    while True:
        try:
            return target.read_text()
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise UsageError(f"gave up waiting for {target} after {timeout_s:.0f} s")
        time.sleep(poll_s)


def sleep_until(target: float, spin_s: float = 0.0005) -> None:
    """Sleep until unix time ``target``; spin the last ``spin_s`` for sub-millisecond accuracy."""
    while True:
        left = target - time.time()
        if left <= 0:
            return
        if left > spin_s:
            time.sleep(left - spin_s)


def calibrate(handle: Handler, count: int, gap_s: float = 0.002) -> list[float]:
    """Service times (ms) of ``count`` requests served one at a time, ``gap_s`` apart."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        handle()
        times.append((time.perf_counter() - start) * 1000.0)
        time.sleep(gap_s)
    return times


#: The longest a probe of :func:`calibrate_under_load` serves (s), and the fewest requests it
#: serves: a slow server's probe (GPT-2 ``generate``, 70 ms a request, 200 requests at load
#: 0.5 take 30 s) is cut to this span, the bench's load check corrects what it misses.
PROBE_S = 10.0
PROBE_LEAST = 50


def calibrate_under_load(
    handle: Handler,
    isolated_ms: Sequence[float],
    load: float,
    rounds: int = 2,
    seed: int = 1,
    probe_s: float = PROBE_S,
) -> list[float]:
    """Service times (ms) of requests served open loop at ``load`` (``rounds`` probes).

    A server's requests may take longer when they follow each other at a given rate than one
    at a time (an eager server's CPU and the GPU's clocks settle differently), so the rate
    that keeps it busy ``load`` of the time is found under that load: each probe serves as
    many requests as ``isolated_ms`` holds, or as many as fit in ``probe_s`` seconds at its
    rate (at least ``PROBE_LEAST``), Poisson at ``load`` / the previous mean service time, and
    returns each request's own time (end - start, queueing excluded).
    """
    from .load import arrival_rate, poisson_arrivals

    service = list(isolated_ms)
    for round_ in range(rounds):
        rate = arrival_rate(load, sum(service) / len(service) / 1000.0)
        count = min(len(isolated_ms), max(PROBE_LEAST, int(probe_s * rate)))
        offsets = poisson_arrivals(count, rate, seed + round_)
        got = serve(handle, offsets, time.time() + 0.01)
        service = [
            (end - start) * 1000.0 for start, end in zip(got["start"], got["end"], strict=True)
        ]
    return service


def serve(
    handle: Handler,
    offsets: Sequence[float],
    t0: float,
    hint: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    spin_s: float = 0.0005,
) -> dict[str, list[float]]:
    """Serve one request per offset, open loop: request ``i`` is due at ``t0 + offsets[i]``.

    Requests are served in order by this one thread; a request that is due while an earlier one
    runs waits, and that wait counts in its latency (latency = end - scheduled arrival). The
    hint is entered at the moment the request starts, before its inputs are prepared.
    """
    hint = hint or contextlib.nullcontext
    scheduled, starts, ends = [], [], []
    for offset in offsets:
        due = t0 + offset
        sleep_until(due, spin_s)
        start = time.time()
        with hint():
            handle()
        ends.append(time.time())
        starts.append(start)
        scheduled.append(due)
    return {"scheduled": scheduled, "start": starts, "end": ends}


class StepClock:
    """Time-stamps training steps at completion, on a helper thread.

    ``submit(token)`` after each step: a ``None`` token is stamped at once; otherwise the helper
    waits on ``token.synchronize()`` (a CUDA event releases the GIL while it waits) and stamps
    the unix time it returned.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done = object()
        self._thread = threading.Thread(target=self._run, name="step-clock", daemon=True)
        self._thread.start()

    def submit(self, token: Any) -> None:
        if token is None:
            self.times.append(time.time())
        else:
            self._queue.put(token)

    def _run(self) -> None:
        while True:
            token = self._queue.get()
            if token is self._done:
                return
            token.synchronize()
            self.times.append(time.time())

    def close(self, timeout_s: float = 30.0) -> list[float]:
        """Wait for the steps submitted so far, stop the helper, return the stamps (sorted)."""
        self._queue.put(self._done)
        self._thread.join(timeout_s)
        return sorted(self.times)


class StopFlag:
    """Set by SIGTERM/SIGINT (main thread only) or by the appearance of a stop file."""

    def __init__(self, stop_file: str | os.PathLike[str] | None, install_signals: bool = True):
        self.stop_file = Path(stop_file) if stop_file else None
        self.event = threading.Event()
        if install_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.event.set())

    def __call__(self) -> bool:
        if self.event.is_set():
            return True
        if self.stop_file is not None and self.stop_file.exists():
            self.event.set()
        return self.event.is_set()


def warm_up(step: Handler, min_steps: int, min_seconds: float) -> int:
    """Run ``step`` at least ``min_steps`` times and for at least ``min_seconds``; wait for the
    last one. Returns the number of steps run."""
    start = time.monotonic()
    count = 0
    token = None
    while count < min_steps or time.monotonic() - start < min_seconds:
        token = step()
        count += 1
    if token is not None and hasattr(token, "synchronize"):
        token.synchronize()
    return count


def train(step: Handler, stop: Callable[[], bool], max_seconds: float) -> list[float]:
    """Run ``step`` until ``stop()`` is true (or ``max_seconds`` pass); completion stamps."""
    clock = StepClock()
    deadline = time.monotonic() + max_seconds
    while not stop() and time.monotonic() < deadline:
        clock.submit(step())
    return clock.close()


class DeviceMemory(Protocol):
    """Device memory as the memory-pressure scenarios use it (torch's in
    :class:`gpreempt.bench.builtin_workloads.TorchMemory`; ``--memory-fn`` names another)."""

    def free_bytes(self) -> int:
        """Free memory on the device now."""

    def allocate(self, nbytes: int) -> Any:
        """A block of ``nbytes`` (kept alive by the caller); MemoryError when out of memory."""

    def release(self, blocks: list[Any]) -> None:
        """Give ``blocks`` back to the device (not only to a cache)."""


def grow_working_set(
    memory: DeviceMemory, total: int, chunk: int, wait_s: float, poll_s: float = 0.005
) -> tuple[list[Any], dict[str, Any]]:
    """Allocate ``total`` bytes in chunks of ``chunk``. On out-of-memory, retry every
    ``poll_s`` until ``wait_s`` after the first failure; then give up, release what was got and
    report ``oom``. Returns the blocks held and what happened (bytes, times, errors)."""
    start = time.perf_counter()
    info: dict[str, Any] = {
        "asked_bytes": total,
        "free_before_bytes": memory.free_bytes(),
        "start_t": time.time(),
        "oom_errors": 0,
        "waited_s": 0.0,
    }
    held: list[Any] = []
    got = 0
    first_oom: float | None = None
    while got < total:
        size = min(chunk, total - got)
        try:
            held.append(memory.allocate(size))
        except MemoryError as exc:
            now = time.perf_counter()
            info["oom_errors"] += 1
            info["last_error"] = str(exc)[:300]
            first_oom = now if first_oom is None else first_oom
            if now - first_oom >= wait_s:
                break
            time.sleep(poll_s)
            continue
        got += size
    if first_oom is not None:
        info["waited_s"] = time.perf_counter() - first_oom
    info["got_bytes"] = got
    info["oom"] = got < total
    if info["oom"]:  # a failed request keeps nothing
        memory.release(held)
        held = []
    info["seconds"] = time.perf_counter() - start
    info["end_t"] = time.time()
    return held, info


class Growth:
    """Grow the working set once, inside request number ``index`` (before its work), keep it
    for the requests that follow, release it with :meth:`release`."""

    def __init__(
        self, memory: DeviceMemory, index: int, total: int, chunk: int, wait_s: float
    ) -> None:
        self.memory = memory
        self.index = index
        self.total = total
        self.chunk = chunk
        self.wait_s = wait_s
        self.held: list[Any] = []
        self.info: dict[str, Any] | None = None
        self._calls = 0

    def wrap(self, handle: Handler) -> Handler:
        def request() -> Any:
            if self._calls == self.index:
                self.held, info = grow_working_set(self.memory, self.total, self.chunk, self.wait_s)
                self.info = {"index": self.index, **info}
            self._calls += 1
            return handle()

        return request

    def release(self) -> dict[str, Any] | None:
        """Free the grown working set; returns what happened at the growth."""
        self.memory.release(self.held)
        self.held = []
        return self.info


def growth_index(offsets: Sequence[float], at_s: float) -> int:
    """The first request due ``at_s`` or later into the window (the last one if none is)."""
    for i, offset in enumerate(offsets):
        if offset >= at_s:
            return i
    return len(offsets) - 1
