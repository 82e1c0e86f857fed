"""Bounds on what clients may ask of the daemon: how much, how often, and which values.

Every field of a request is checked for its type and range before anything acts on it
(``true`` is not a pid, ``1e308`` is not a time slice), and each user is held to a number of
connections, tasks and messages a second, so that no client, hostile or broken, can exhaust
the daemon's descriptors, memory or loop. With ``--shared``, users other than root are also
held to a priority ceiling root chooses (``--max-user-priority``, ``--allow-priority``).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field

from ..errors import PermissionDenied, UsageError
from ..priority import parse_priority, priority_name

#: Connections one user may hold open at once (each launcher and in-process client holds one).
MAX_CONNECTIONS_PER_UID = 2048
#: Tasks one user may have registered at once.
MAX_TASKS_PER_UID = 2048
#: Messages a second one user may send, sustained, and in a burst; beyond that the daemon
#: stops reading that user's connections until the allowance refills.
MESSAGE_RATE_PER_UID = 5000.0
MESSAGE_BURST_PER_UID = 10000.0
#: Messages handled from one connection before the loop turns to the others.
MESSAGES_PER_TURN = 16
#: Descriptors the daemon keeps for itself (log, lock, selector, libraries) when it sizes the
#: number of connections it accepts; each connection may hold three (socket, block, doorbell)
#: and register a task, which holds one (its pidfd).
RESERVED_FDS = 64
FDS_PER_CONNECTION = 4
#: Descriptors the daemon may hold on behalf of one user (sockets, control blocks, doorbells,
#: descriptors received and not yet claimed, descriptors queued for its clients); at most
#: half of what the daemon may open, so that no user, root included, can starve the others.
MAX_FDS_PER_UID = 16384
#: Largest ``--min-share`` and ``--timeslice-ms`` users other than root may ask of a shared
#: daemon: more would let one user's low task keep another user's high one off the GPU.
MAX_USER_MIN_SHARE = 0.5
MAX_USER_TIMESLICE_MS = 1000.0


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open descriptors to its hard limit; the result."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


@dataclass
class TokenBucket:
    """``rate`` events a second, ``burst`` at once."""

    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float = field(default_factory=time.monotonic)

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens = self.burst
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def ready_at(self, now: float) -> float:
        """When the next event will be allowed."""
        return now + max(0.0, 1 - self.tokens) / self.rate


@dataclass
class Limits:
    """The daemon's bounds; the ``max_user_priority`` and ``allowed`` ceilings apply to users
    other than root of a ``--shared`` daemon only."""

    shared: bool = False
    connections_per_uid: int = MAX_CONNECTIONS_PER_UID
    tasks_per_uid: int = MAX_TASKS_PER_UID
    message_rate: float = MESSAGE_RATE_PER_UID
    message_burst: float = MESSAGE_BURST_PER_UID
    #: Highest priority a user may ask for (shared daemons).
    max_user_priority: int = 0
    #: Ceilings root granted to particular uids (shared daemons).
    allowed: dict[int, int] = field(default_factory=dict)
    #: Connections the daemon accepts in all (sized from its descriptor limit at start).
    max_connections: int = 1 << 16
    #: Descriptors held for one user (sized from the descriptor limit at start).
    fds_per_uid: int = MAX_FDS_PER_UID
    _buckets: dict[int, TokenBucket] = field(default_factory=dict)

    def size_for_fd_limit(self, fd_limit: int) -> None:
        """Accept no more connections than descriptors allow (with room to spare)."""
        self.max_connections = max(16, (fd_limit - RESERVED_FDS) // FDS_PER_CONNECTION)
        self.fds_per_uid = min(MAX_FDS_PER_UID, max(64, (fd_limit - RESERVED_FDS) // 2))

    def connections_allowed(self) -> int:
        """Connections one user (root too) may hold: the per-user limit, and never more
        than half of all the daemon accepts."""
        return min(self.connections_per_uid, max(16, self.max_connections // 2))

    def allow_message(self, uid: int, now: float) -> float | None:
        """None if ``uid`` may send one more message now, else when it may."""
        bucket = self._buckets.get(uid)
        if bucket is None:
            bucket = self._buckets[uid] = TokenBucket(self.message_rate, self.message_burst)
        return None if bucket.take(now) else bucket.ready_at(now)

    def check_connection(self, uid: int, per_uid: int, total: int) -> str | None:
        """Why a new connection from ``uid`` (holding ``per_uid`` of ``total``) is refused."""
        if total >= self.max_connections:
            return f"the daemon serves its maximum of {self.max_connections} connections"
        if per_uid >= self.connections_allowed():
            return (
                f"uid {uid} already holds {per_uid} connections (the limit per user); "
                "close some clients first"
            )
        return None

    def check_task_count(self, uid: int, count: int) -> None:
        if uid != 0 and count >= self.tasks_per_uid:
            raise UsageError(
                f"uid {uid} already has {count} tasks registered (the limit per user); "
                "end or detach some first"
            )

    def ceiling(self, uid: int) -> int | None:
        """The highest priority ``uid`` may use, or None for no ceiling."""
        if not self.shared or uid == 0:
            return None
        return self.allowed.get(uid, self.max_user_priority)

    def check_shares(self, uid: int, min_share: float | None, timeslice_ms: float | None) -> None:
        """Refuse a ``--min-share`` or ``--timeslice-ms`` above what ``uid`` may ask for."""
        if self.ceiling(uid) is None:
            return
        if min_share is not None and min_share > MAX_USER_MIN_SHARE:
            raise PermissionDenied(
                f"--min-share {min_share:g} is above the {MAX_USER_MIN_SHARE:g} users other "
                "than root may ask of a shared daemon"
            )
        if timeslice_ms is not None and timeslice_ms > MAX_USER_TIMESLICE_MS:
            raise PermissionDenied(
                f"--timeslice-ms {timeslice_ms:g} is above the {MAX_USER_TIMESLICE_MS:g} ms users "
                "other than root may ask of a shared daemon"
            )

    def clamp(
        self, uid: int, priority: int, min_share: float | None, timeslice_ms: float | None
    ) -> tuple[int, float | None, float | None]:
        """``uid``'s settings cut to what it may ask for now (a persisted task registered
        again by a daemon started with other limits)."""
        top = self.ceiling(uid)
        if top is None:
            return priority, min_share, timeslice_ms
        if min_share is not None:
            min_share = min(min_share, MAX_USER_MIN_SHARE)
        if timeslice_ms is not None:
            timeslice_ms = min(timeslice_ms, MAX_USER_TIMESLICE_MS)
        return min(priority, top), min_share, timeslice_ms

    def check_priority(self, uid: int, priority: int) -> None:
        top = self.ceiling(uid)
        if top is not None and priority > top:
            raise PermissionDenied(
                f"priority {priority_name(priority)} ({priority}) is above the ceiling of "
                f"uid {uid} on this shared daemon ({priority_name(top)}, {top}); ask root to "
                "start it with --allow-priority UID=PRIORITY"
            )


def parse_allowance(text_value: str) -> tuple[int, int]:
    """``UID=PRIORITY`` or ``USER=PRIORITY`` (for ``--allow-priority``)."""
    who, sep, level = text_value.partition("=")
    if not sep or not who.strip():
        raise UsageError(f"--allow-priority takes USER=PRIORITY, got {text_value!r}")
    who = who.strip()
    if who.isdigit():
        uid = int(who)
    else:
        import pwd

        try:
            uid = pwd.getpwnam(who).pw_uid
        except KeyError:
            raise UsageError(f"--allow-priority: no user named {who!r}") from None
    return uid, parse_priority(level)
