"""The GPUs a task counts on: those it registered on, then those its processes add while they
run. A rank of a multi-GPU job names its GPU when it opens its channel (``client/ranks.py``);
a process's driver-level gate names each GPU it makes a CUDA context on (connections.py). A
more important task on any of them preempts the whole task; a GPU goes when the last process
that added it does."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..field_checks import MAX_GPUS


@dataclass
class TaskGpus:
    """One task's GPUs, and which process added which."""

    registered: tuple[int, ...]
    #: GPUs its processes added (not among those it registered on), by connection id.
    added: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def all(self) -> tuple[int, ...]:
        """All of them, those it registered on first."""
        extra = dict.fromkeys(gpu for gpus in self.added.values() for gpu in gpus)
        return (*self.registered, *extra)

    def add(self, gpu: int, conn_id: int) -> bool:
        """Count ``gpu`` while connection ``conn_id`` lasts; True where it is new. No more
        than :data:`MAX_GPUS`, as a registration may name."""
        if gpu in self.registered:
            return False
        counted = self.all
        new = gpu not in counted
        if new and len(counted) >= MAX_GPUS:
            return False
        mine = self.added.get(conn_id, ())
        if gpu not in mine:  # each process's own: another's going leaves it
            self.added[conn_id] = (*mine, gpu)
        return new

    def drop(self, conn_id: int) -> None:
        """The process of connection ``conn_id`` is gone: the GPUs only it added go too."""
        self.added.pop(conn_id, None)
