"""Which processes may become tasks, and the task a registration's fields describe.

A process is registered only once it is checked: not one the daemon must never stop (init,
the daemon and its ancestors), the caller's own unless the caller is root, and one this
daemon may act on. Every field of the request was checked for its type and range when it was
read (messages.py); the name is escaped and unique among its owner's tasks.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import PermissionDenied, UsageError
from ..mechanisms import MechanismSet
from ..mechanisms.base import Target
from ..messages import TaskFields
from ..procinfo import ProcessInfo, read_process
from .identity import clean_name
from .limits import Limits
from .registry import Registry
from .task import Task
from .task_identity import TaskIdentity


def check_owner(caller_uid: int, uid: int, what: str) -> None:
    """Refuse a caller other than root acting on what belongs to another uid."""
    if caller_uid != 0 and caller_uid != uid:
        raise PermissionDenied(
            f"{what} belongs to uid {uid}; you (uid {caller_uid}) may act only on your own "
            "processes"
        )


class Registrar:
    """Builds tasks for the daemon's registry from checked processes and fields."""

    def __init__(
        self,
        registry: Registry,
        limits: Limits,
        mechanisms: Callable[[], MechanismSet],
        protected: Callable[[], frozenset[int]],
    ) -> None:
        self.registry = registry
        self.limits = limits
        #: The daemon's mechanisms and protected pids, known once it has started.
        self._mechanisms = mechanisms
        self._protected = protected

    def registrable(self, caller_uid: int | None, pid: int) -> ProcessInfo:
        """The process ``pid``, once checked: not one the daemon must never stop, the
        caller's own (or the caller is root, or None: the daemon itself), and one this daemon
        can act on."""
        info = read_process(pid)
        if caller_uid is not None:
            check_owner(caller_uid, info.uid, f"process {pid}")
        if pid in self._protected():
            what = "init" if pid == 1 else "this daemon or one of its ancestors"
            raise PermissionDenied(
                f"process {pid} is {what}: stopping it would stop the daemon; not registered"
            )
        if os.getuid() != 0 and info.uid != os.getuid():
            raise PermissionDenied(
                f"this daemon runs as uid {os.getuid()} and cannot preempt process {pid} of uid "
                f"{info.uid}; run the daemon as root or as that user"
            )
        return info

    def new_task(self, caller_uid: int | None, info: ProcessInfo, fields: TaskFields) -> Task:
        """A task for process ``info`` with ``fields`` (checked for type and range when read,
        messages.py); the name escaped and unique among its owner's tasks, the mechanism one
        this machine has, the priority one the caller may ask for."""
        given = fields.name
        name = clean_name(given or info.name) or str(info.pid)
        if given and self.registry.name_taken(name, info.uid) is not None:
            taken = self.registry.name_taken(name, info.uid)
            assert taken is not None
            raise UsageError(
                f"you already have a task named {name!r} (pid {taken.pid}); give another name"
            )
        name = self.registry.free_name(name, info.uid)
        mechanisms = self._mechanisms()
        chosen = mechanisms.get(fields.mechanism)  # refuses mechanisms this machine lacks
        if fields.check:  # a running process: check it now
            chosen.check(Target(pid=info.pid, start_time=info.start_time))
        if fields.reserve_bytes and mechanisms.lock_unavailable:
            raise UsageError(
                "--reserve-memory needs memory eviction, which needs the NVIDIA driver "
                f"checkpoint API, and this daemon has none ({mechanisms.lock_unavailable}); "
                "leave --reserve-memory out"
            )
        if caller_uid is not None:
            self.limits.check_priority(caller_uid, fields.priority)
            self.limits.check_shares(caller_uid, fields.min_share, fields.timeslice_ms)
        return Task(TaskIdentity.of(self.registry.new_id(), info, name, fields))
