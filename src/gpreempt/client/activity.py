"""Telling the daemon when this process wants the GPU, and yielding when it should not."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from . import session
from .scheduler import current_task, task_scheduler


class request(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Mark this process active for the duration of a block (or of a decorated function).

    Call it at the moment a request *arrives*, before preparing its inputs: less important
    tasks on the same GPU are suspended while any request is open, and their in-flight work
    drains while this process is still on the CPU. Counted across threads and nesting. A
    no-op outside gpreempt.
    """

    def __enter__(self) -> request:
        current = session.current()
        self._session = current
        if current is not None:
            current.enter_request()
        task = current_task()
        self._task = task
        if task is not None:  # a thread of an in-process GPUScheduler task
            task_scheduler(task)._enter(task)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._task is not None:
            task_scheduler(self._task)._exit(self._task)
        if self._session is not None:
            self._session.exit_request()


def should_yield() -> bool:
    """True while a more important task on this GPU wants it: the daemon closed our gate, or
    a task we watch (one of our user's tasks that outrank us there) is active."""
    current = session.current()
    return current is not None and current.connected and current.must_wait()


def yield_point(poll_s: float = 0.0005) -> float:
    """Block while :func:`should_yield` is true; returns the seconds spent waiting.

    For code that prefers to yield cooperatively at safe points (between steps) rather than
    be stopped wherever it is.
    """
    current = session.current()
    if current is None or not current.must_wait():
        return 0.0
    start = time.perf_counter()
    while current.connected and current.must_wait():
        time.sleep(poll_s)
    return time.perf_counter() - start
