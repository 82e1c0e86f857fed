"""The daemon's tasks: every registered process by id, found by pid or name."""

from __future__ import annotations

import contextlib
import os

from ..errors import NoSuchTask
from ..policy import Snapshot
from .task import Task


class Registry:
    """Tasks by id, with lookup by name or pid."""

    def __init__(self) -> None:
        self.tasks: dict[int, Task] = {}
        self._next_id = 1

    def new_id(self) -> int:
        task_id = self._next_id
        self._next_id += 1
        return task_id

    def add(self, task: Task) -> None:
        self.tasks[task.task_id] = task

    def snapshot(self, now: float) -> Snapshot:
        """Every task as the policy sees it at daemon time ``now``."""
        return Snapshot(now=now, tasks=tuple(t.view(now) for t in self.tasks.values()))

    def add_pidfd(self, task: Task) -> None:
        """Open the pidfd of ``task``'s process, checked against its start time."""
        from ..procinfo import open_verified

        try:
            task.pidfd = open_verified(task.pid, task.identity.start_time)
        except (OSError, AttributeError):
            task.pidfd = None  # no pidfds here: signals check the start time each time

    def remove(self, task_id: int) -> Task | None:
        task = self.tasks.pop(task_id, None)
        if task is not None and task.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(task.pidfd)
            task.pidfd = None
        return task

    def by_pid(self, pid: int) -> Task | None:
        return next((t for t in self.tasks.values() if t.pid == pid), None)

    def count_of(self, uid: int) -> int:
        """Tasks of ``uid``."""
        return sum(1 for t in self.tasks.values() if t.uid == uid)

    def name_taken(self, name: str, uid: int) -> Task | None:
        """The task of ``uid`` already named ``name``, if any (names are unique per owner)."""
        return next((t for t in self.tasks.values() if t.uid == uid and t.name == name), None)

    def free_name(self, name: str, uid: int) -> str:
        """``name``, or ``name-2``, ``name-3``... : the first no task of ``uid`` uses."""
        candidate, n = name, 1
        while self.name_taken(candidate, uid) is not None:
            n += 1
            candidate = f"{name}-{n}"
        return candidate

    def find(self, target: str, uid: int | None = None) -> Task:
        """The task whose pid ``target`` is, else the one named ``target``: among ``uid``'s
        own tasks first, so that no other user's task name can shadow them."""
        text = str(target).strip()
        matches: list[Task] = []
        if text.isdigit():
            number = int(text)
            matches = [t for t in self.tasks.values() if t.pid == number]
        if not matches and uid is not None:
            matches = [t for t in self.tasks.values() if t.name == text and t.uid == uid]
        if not matches:
            matches = [t for t in self.tasks.values() if t.name == text]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            pids = ", ".join(str(t.pid) for t in matches)
            raise NoSuchTask(f"{len(matches)} tasks are named {text!r} (pids {pids}): use a pid")
        known = ", ".join(sorted(f"{t.name} ({t.pid})" for t in self.tasks.values())) or "none"
        if len(self.tasks) > 20:
            known = f"{len(self.tasks)} tasks (see `gpreempt status`)"
        raise NoSuchTask(f"no task named or with pid {text!r}; registered tasks: {known}")
