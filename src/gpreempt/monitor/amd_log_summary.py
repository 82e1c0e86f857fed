"""What one HIP/CLR runtime log says, as counted by :mod:`.amd_log`: per process, per
hardware queue, per kernel, and for the whole file (:class:`LogSummary`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class QueueStats:
    """One hardware queue of one process, as the log shows it."""

    pid: int | None
    hw_queue: str
    sw_queue: str | None = None
    #: ROCr's process-wide queue counter from the dispatch lines (not a KFD id).
    id: int | None = None
    #: From the ``Created SWq=... with priority %d`` line, when the log holds it.
    priority: int | None = None
    size: int | None = None
    cooperative: bool | None = None
    created: bool = False
    dispatches: int = 0
    barrier_packets: int = 0
    #: Times a stream took this queue (``acquireQueue refCount`` lines).
    acquires: int = 0
    kernels: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "hw_queue": self.hw_queue,
            "sw_queue": self.sw_queue,
            "id": self.id,
            "priority": self.priority,
            "size": self.size,
            "cooperative": self.cooperative,
            "created_in_log": self.created,
            "dispatches": self.dispatches,
            "barrier_packets": self.barrier_packets,
            "acquires": self.acquires,
            "top_kernels": [{"name": n, "count": c} for n, c in self.kernels.most_common(5)],
        }


@dataclass
class KernelStats:
    """One kernel name: launches (``ShaderName`` lines) and the shapes it was dispatched with."""

    name: str
    count: int = 0
    dispatches: int = 0
    grids: Counter[tuple[int, int, int] | str] = field(default_factory=Counter)
    workgroups: Counter[tuple[int, int, int] | str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        def shapes(counter: Counter[Any]) -> list[dict[str, Any]]:
            return [
                {"shape": list(k) if isinstance(k, tuple) else k, "count": c}
                for k, c in counter.most_common(5)
            ]

        return {
            "name": self.name,
            # Launches: ShaderName lines, or dispatches where the log has no ShaderName.
            "count": max(self.count, self.dispatches),
            "shader_lines": self.count,
            "dispatches": self.dispatches,
            "grids": shapes(self.grids),
            "workgroups": shapes(self.workgroups),
        }


@dataclass
class ProcessStats:
    pid: int
    lines: int = 0
    threads: int = 0
    dispatches: int = 0
    first_us: int | None = None
    last_us: int | None = None
    first_dispatch_us: int | None = None
    last_dispatch_us: int | None = None

    def dispatch_rate(self) -> float | None:
        """Dispatches per second between this process's first and last dispatch."""
        if self.first_dispatch_us is None or self.last_dispatch_us is None:
            return None
        span = self.last_dispatch_us - self.first_dispatch_us
        return self.dispatches / (span / 1e6) if span > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "lines": self.lines,
            "threads": self.threads,
            "dispatches": self.dispatches,
            "first_us": self.first_us,
            "last_us": self.last_us,
            "dispatch_rate_per_s": self.dispatch_rate(),
        }


@dataclass
class LogSummary:
    """Everything one log file says about queues and kernels."""

    path: str
    bytes_read: int = 0
    lines: int = 0
    #: Runtime log lines (``:N:...``).
    log_lines: int = 0
    #: Lines that are not runtime log lines (the program's own output): not errors.
    other_lines: int = 0
    #: Runtime lines that look like log lines or dispatch records but could not be parsed.
    unparsed_lines: int = 0
    unparsed_examples: list[str] = field(default_factory=list)
    truncated_last_line: bool = False
    max_level: int | None = None
    first_us: int | None = None
    last_us: int | None = None
    dispatches: int = 0
    #: Dispatches whose header has the barrier bit set.
    barrier_bit: int = 0
    acquire_scopes: Counter[str] = field(default_factory=Counter)
    release_scopes: Counter[str] = field(default_factory=Counter)
    barrier_packets: int = 0
    barrier_kinds: Counter[str] = field(default_factory=Counter)
    acquire_queue_lines: int = 0
    shader_lines: int = 0
    processes: dict[int, ProcessStats] = field(default_factory=dict)
    queues: dict[tuple[int | None, str], QueueStats] = field(default_factory=dict)
    kernels: dict[str, KernelStats] = field(default_factory=dict)

    @property
    def span_s(self) -> float | None:
        if self.first_us is None or self.last_us is None:
            return None
        return max(0, self.last_us - self.first_us) / 1e6

    @property
    def dispatch_rate(self) -> float | None:
        span = self.span_s
        return self.dispatches / span if span and self.dispatches else None

    @property
    def pid_logged(self) -> bool:
        return bool(self.processes)

    def queue(self, pid: int | None, hw_queue: str) -> QueueStats:
        key = (pid, hw_queue)
        stats = self.queues.get(key)
        if stats is None:
            stats = self.queues[key] = QueueStats(pid=pid, hw_queue=hw_queue)
        return stats

    def kernel(self, name: str) -> KernelStats:
        stats = self.kernels.get(name)
        if stats is None:
            stats = self.kernels[name] = KernelStats(name=name)
        return stats

    def sorted_queues(self) -> list[QueueStats]:
        return sorted(
            self.queues.values(), key=lambda q: (q.pid or 0, q.id if q.id is not None else 1 << 30)
        )

    def sorted_kernels(self) -> list[KernelStats]:
        return sorted(self.kernels.values(), key=lambda k: (-max(k.count, k.dispatches), k.name))

    def notes(self) -> list[str]:
        """Caveats a reader needs to interpret the numbers."""
        out = []
        if not self.pid_logged and self.log_lines:
            out.append("no [pid:...] prefix: AMD_LOG_LEVEL < 4, processes cannot be told apart")
        if self.shader_lines and not self.dispatches:
            out.append(
                "ShaderName lines but no dispatch lines: set AMD_LOG_LEVEL=4 (or higher) to see "
                "which hardware queue each kernel went to"
            )
        if self.unparsed_lines:
            out.append(f"{self.unparsed_lines} runtime line(s) could not be parsed")
        if self.truncated_last_line:
            out.append("the last line is cut short (log still being written?)")
        return out

    def to_dict(self, top: int = 20) -> dict[str, Any]:
        kernels = self.sorted_kernels()
        return {
            "path": self.path,
            "bytes": self.bytes_read,
            "lines": self.lines,
            "log_lines": self.log_lines,
            "other_lines": self.other_lines,
            "unparsed_lines": self.unparsed_lines,
            "unparsed_examples": self.unparsed_examples,
            "truncated_last_line": self.truncated_last_line,
            "max_level": self.max_level,
            "first_us": self.first_us,
            "last_us": self.last_us,
            "span_s": self.span_s,
            "dispatches": self.dispatches,
            "dispatch_rate_per_s": self.dispatch_rate,
            "barrier_bit": self.barrier_bit,
            "acquire_scopes": dict(self.acquire_scopes),
            "release_scopes": dict(self.release_scopes),
            "barrier_packets": self.barrier_packets,
            "barrier_kinds": dict(self.barrier_kinds),
            "acquire_queue_lines": self.acquire_queue_lines,
            "shader_lines": self.shader_lines,
            "processes": [p.to_dict() for p in sorted(self.processes.values(), key=_pid_key)],
            "queues": [q.to_dict() for q in self.sorted_queues()],
            "distinct_kernels": len(kernels),
            "kernels": [k.to_dict() for k in kernels[:top]],
            "notes": self.notes(),
        }


def _pid_key(p: ProcessStats) -> int:
    return p.pid
