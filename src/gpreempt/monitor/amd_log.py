"""Streaming analysis of HIP/CLR runtime logs (``AMD_LOG_LEVEL`` 3 to 5).

What the runtime prints, and what this module reads from it (ROCm/clr ``log_printf`` and
``rocvirtual.cpp``/``rocdevice.cpp``):

* every line starts ``:%d:%-25s:%-4d: %010lu us: `` (level, source file, source line,
  microseconds of a monotonic clock); at ``AMD_LOG_LEVEL >= 4`` a ``[pid:%d tid: 0x%5x]``
  follows (some builds print ``[pid:%-5d tid:0x%lx]``; both are accepted);
* queue creation: ``Created SWq=%p to map on HWq=%p with size %d with priority %d,
  cooperative: %i``; ``acquireQueue refCount: %p (%d)`` each time a stream takes a queue;
* each kernel: ``ShaderName : %s`` (level 3) and then, at level 4, the AQL packet:
  ``SWq=0x%zx, HWq=0x%zx, id=%d, Dispatch Header = 0x%x (type=%d, barrier=%d, acquire=%d,
  release=%d), setup=%d, grid=[...], workgroup=[...], private_seg_size=...``;
  barrier packets print ``... BarrierAND Header = ...`` (``Barrier-AND``/``Barrier-OR`` in
  newer builds).

``HWq`` is the address of the hardware (AQL) queue's ring buffer in that process, ``SWq`` the
``hsa_queue_t`` ROCr hands out, ``id`` ROCr's process-wide queue counter (not a KFD queue id).

The scan is built for multi-gigabyte logs: bytes lines read in large blocks, a cheap
substring test before any parsing, and dispatch lines counted by their raw text (the part
that names queue, header, grid and workgroup), which is parsed once per distinct text.
Memory stays bounded: the distinct texts are folded into totals whenever they grow large.
"""

from __future__ import annotations

import gzip
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

#: Bytes read per block: large enough that per-block overhead vanishes.
BLOCK_SIZE = 4 << 20
#: Distinct dispatch texts kept before they are folded into totals (bounds memory).
FOLD_THRESHOLD = 50_000
#: Distinct grid or workgroup shapes remembered per kernel; the rest are counted as "other".
MAX_SHAPES_PER_KERNEL = 32

_DISPATCH_RE = re.compile(
    rb"SWq=(0x[0-9a-fA-F]+), HWq=(0x[0-9a-fA-F]+), id=(-?\d+),[ \w-]*? ?Dispatch Header = "
    rb"0x([0-9a-fA-F]+) \(type=(\d+), barrier=(\d+), acquire=(\d+), release=(\d+)\)"
)
_GRID_RE = re.compile(rb"grid=\[(\d+), (\d+), (\d+)\]")
_WORKGROUP_RE = re.compile(rb"workgroup=\[(\d+), (\d+), (\d+)\]")
_BARRIER_RE = re.compile(
    rb"SWq=(0x[0-9a-fA-F]+), HWq=(0x[0-9a-fA-F]+), id=(-?\d+),[ \w-]*? ?"
    rb"(BarrierAND|BarrierOR|Barrier-AND|Barrier-OR|BarrierValue|[\w-]+) Header = "
)
_CREATED_RE = re.compile(
    rb"Created SWq=(0x[0-9a-fA-F]+|\(nil\)) to map on HWq=(0x[0-9a-fA-F]+|\(nil\))"
    rb"(?: with size (\d+))?(?: with priority (-?\d+))?(?:, cooperative: (\d+))?"
)
_ACQUIRE_RE = re.compile(rb"acquireQueue refCount: (0x[0-9a-fA-F]+) \((\d+)\)")
_PREFIX_RE = re.compile(rb":\d:")

#: HSA fence scopes in the dispatch header's acquire/release fields.
FENCE_SCOPES = {0: "none", 1: "agent", 2: "system"}


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


# ----------------------------------------------------------------------------------------------
# Reading


def open_log(path: str | os.PathLike[str]) -> tuple[BinaryIO, BinaryIO]:
    """Open a log, gzip or plain (by its magic bytes, not its name).

    Returns (reader, raw): read from ``reader``; ``raw.tell()`` is the position in the file
    on disk, for a progress bar.
    """
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]
    return raw, raw


def iter_blocks(reader: BinaryIO, block_size: int = BLOCK_SIZE) -> Iterator[bytes]:
    while True:
        block = reader.read(block_size)
        if not block:
            return
        yield block


def analyze_file(
    path: str | os.PathLike[str],
    progress: Callable[[int], None] | None = None,
) -> LogSummary:
    """Analyse one log file (plain or gzip). ``progress(n)`` gets bytes of the file read."""
    reader, raw = open_log(path)
    try:
        last = 0

        def blocks() -> Iterator[bytes]:
            nonlocal last
            for block in iter_blocks(reader):
                yield block
                if progress is not None:
                    pos = raw.tell()
                    progress(pos - last)
                    last = pos

        return analyze_blocks(blocks(), path=os.fspath(path))
    finally:
        reader.close()
        if raw is not reader:
            raw.close()


def analyze_lines(lines: Iterable[bytes | str], path: str = "<lines>") -> LogSummary:
    """Analyse lines already in memory (tests, small inputs). Newlines optional."""
    data = b"".join(
        (line.encode() if isinstance(line, str) else line).rstrip(b"\n") + b"\n" for line in lines
    )
    return analyze_blocks([data], path=path)


def analyze_blocks(blocks: Iterable[bytes], path: str = "<stream>") -> LogSummary:
    """Analyse a log given as consecutive blocks of bytes cut anywhere."""
    scan = _Scanner(LogSummary(path=path))
    carry = b""
    for block in blocks:
        scan.summary.bytes_read += len(block)
        lines = (carry + block).split(b"\n") if carry else block.split(b"\n")
        carry = lines.pop()
        scan.scan(lines)
    if carry:
        # A last line without its newline (a log still being written, or cut): used if it
        # parses, and not counted as an error if it does not.
        before = scan.summary.unparsed_lines
        scan.scan([carry])
        if scan.summary.unparsed_lines > before:
            scan.summary.unparsed_lines = before
            scan.summary.unparsed_examples = scan.summary.unparsed_examples[:before]
        scan.summary.truncated_last_line = True
    return scan.finish()


class _Scanner:
    """The hot loop and its accumulators. Raw keys (bytes) are decoded only in ``_fold``."""

    def __init__(self, summary: LogSummary) -> None:
        self.summary = summary
        #: thread key (bytes inside ``[pid:...]``) -> [lines, first line, last line,
        #: dispatches, first dispatch line, last dispatch line]
        self.threads: dict[bytes, list[Any]] = {}
        #: (thread key, pending kernel name, dispatch text) -> count
        self.dispatch_texts: dict[tuple[bytes, bytes | None, bytes], int] = {}
        #: (thread key, barrier text) -> count
        self.barrier_texts: dict[tuple[bytes, bytes], int] = {}
        #: (thread key, kernel name) -> ShaderName lines
        self.shader_names: dict[tuple[bytes, bytes], int] = {}
        self.first_ts_line: bytes | None = None
        self.last_ts_line: bytes | None = None
        self.levels: set[int] = set()
        #: thread key -> the last ShaderName not yet matched with a dispatch
        self.pending: dict[bytes, bytes] = {}
        #: pid -> dispatches that parsed
        self.pid_dispatches: dict[int | None, int] = {}

    def _unparsed(self, line: bytes, count: int = 1) -> None:
        s = self.summary
        s.unparsed_lines += count
        if len(s.unparsed_examples) < 5:
            s.unparsed_examples.append(line[:200].decode("utf-8", "replace"))

    def scan(self, lines: list[bytes]) -> None:  # noqa: C901 - one loop, kept flat for speed
        s = self.summary
        threads = self.threads
        dispatch_texts = self.dispatch_texts
        shader_names = self.shader_names
        pending = self.pending
        levels = self.levels
        n_log = 0
        n_other = 0
        last_ts_line = self.last_ts_line
        for line in lines:
            if line[:1] != b":":
                if line.strip():
                    n_other += 1
                continue
            if line[2:3] != b":" or not line[1:2].isdigit():
                self._unparsed(line)
                continue
            n_log += 1
            u = line.find(b" us: ", 0, 160)
            if u >= 0:
                last_ts_line = line
                p = line.find(b"[pid:", u, u + 12)
                if p >= 0:
                    q = line.find(b"]", p)
                    tkey = line[p + 5 : q]
                else:
                    tkey = b""
            else:
                tkey = b""
            levels.add(line[1])
            st = threads.get(tkey)
            if st is None:
                st = threads[tkey] = [0, line, line, 0, None, None]
            st[0] += 1
            st[2] = line
            h = line.find(b"HWq=")
            if h >= 0:
                sw = line.rfind(b"SWq=", 0, h)
                if b"Dispatch Header" in line:
                    e = line.find(b", private_seg_size", h)
                    if sw < 0 or e < 0:
                        self._unparsed(line)
                        continue
                    key = (tkey, pending.pop(tkey, None), line[sw:e])
                    dispatch_texts[key] = dispatch_texts.get(key, 0) + 1
                    st[3] += 1
                    if st[4] is None:
                        st[4] = line
                    st[5] = line
                    if len(dispatch_texts) > FOLD_THRESHOLD:
                        self._fold()
                elif b" Header = " in line:
                    e = line.find(b" Header = ", h)
                    if sw < 0:
                        self._unparsed(line)
                        continue
                    bkey = (tkey, line[sw : e + 10])
                    self.barrier_texts[bkey] = self.barrier_texts.get(bkey, 0) + 1
                elif b"Created SWq=" in line:
                    self._created(tkey, line)
                continue
            k = line.find(b"ShaderName : ")
            if k >= 0:
                name = line[k + 13 :].rstrip(b"\r")
                if line.startswith(b"Graph ", k - 6):
                    c = name.rfind(b", device id : ")
                    if c >= 0:
                        name = name[:c]
                if not name:
                    self._unparsed(line)
                    continue
                pending[tkey] = name
                nk = (tkey, name)
                shader_names[nk] = shader_names.get(nk, 0) + 1
                continue
            if b"acquireQueue refCount" in line:
                m = _ACQUIRE_RE.search(line)
                if m is None:
                    self._unparsed(line)
                    continue
                s.acquire_queue_lines += 1
                s.queue(_pid_of(tkey), m.group(1).decode()).acquires += 1
        s.log_lines += n_log
        s.other_lines += n_other
        s.lines += len(lines)
        self.last_ts_line = last_ts_line
        if self.first_ts_line is None:
            for line in lines:
                if line[:1] == b":" and line.find(b" us: ", 0, 160) >= 0:
                    self.first_ts_line = line
                    break

    def _created(self, tkey: bytes, line: bytes) -> None:
        m = _CREATED_RE.search(line)
        if m is None:
            self._unparsed(line)
            return
        sw, hw, size, priority, coop = m.groups()
        q = self.summary.queue(_pid_of(tkey), hw.decode())
        q.created = True
        q.sw_queue = sw.decode()
        if size is not None:
            q.size = int(size)
        if priority is not None:
            q.priority = int(priority)
        if coop is not None:
            q.cooperative = coop != b"0"

    def _fold(self) -> None:
        """Parse each distinct dispatch text once and add it, times its count, to the totals."""
        s = self.summary
        for (tkey, kname, text), count in self.dispatch_texts.items():
            m = _DISPATCH_RE.match(text)
            if m is None:
                self._unparsed(text, count)
                continue
            sw, hw, qid, _header, _type, barrier, acquire, release = m.groups()
            pid = _pid_of(tkey)
            self.pid_dispatches[pid] = self.pid_dispatches.get(pid, 0) + count
            q = s.queue(pid, hw.decode())
            q.sw_queue = q.sw_queue or sw.decode()
            q.id = int(qid)
            q.dispatches += count
            s.dispatches += count
            if barrier == b"1":
                s.barrier_bit += count
            s.acquire_scopes[FENCE_SCOPES.get(int(acquire), acquire.decode())] += count
            s.release_scopes[FENCE_SCOPES.get(int(release), release.decode())] += count
            name = kname.decode("utf-8", "replace") if kname is not None else "(unnamed)"
            q.kernels[name] += count
            k = s.kernel(name)
            k.dispatches += count
            g = _GRID_RE.search(text, m.end())
            w = _WORKGROUP_RE.search(text, m.end())
            _add_shape(k.grids, _shape(g), count)
            _add_shape(k.workgroups, _shape(w), count)
        self.dispatch_texts.clear()

    def finish(self) -> LogSummary:
        self._fold()
        s = self.summary
        for (tkey, text), count in self.barrier_texts.items():
            m = _BARRIER_RE.match(text)
            if m is None:
                self._unparsed(text, count)
                continue
            q = s.queue(_pid_of(tkey), m.group(2).decode())
            q.sw_queue = q.sw_queue or m.group(1).decode()
            q.id = int(m.group(3))
            q.barrier_packets += count
            s.barrier_packets += count
            s.barrier_kinds[m.group(4).decode().replace("-", "")] += count
        for (_tkey, name), count in self.shader_names.items():
            s.shader_lines += count
            s.kernel(name.decode("utf-8", "replace")).count += count
        s.first_us = _timestamp(self.first_ts_line)
        s.last_us = _timestamp(self.last_ts_line)
        if self.levels:
            s.max_level = max(self.levels) - 48  # ASCII digit
        for tkey, (n, first, last, _disp, first_d, last_d) in self.threads.items():
            pid = _pid_of(tkey)
            if pid is None:
                continue
            p = s.processes.get(pid)
            if p is None:
                p = s.processes[pid] = ProcessStats(pid=pid)
            p.lines += n
            p.threads += 1
            p.dispatches = self.pid_dispatches.get(pid, 0)
            p.first_us = _min(p.first_us, _timestamp(first))
            p.last_us = _max(p.last_us, _timestamp(last))
            if first_d is not None:
                p.first_dispatch_us = _min(p.first_dispatch_us, _timestamp(first_d))
                p.last_dispatch_us = _max(p.last_dispatch_us, _timestamp(last_d))
        return s


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _pid_of(tkey: bytes) -> int | None:
    """The pid in a ``[pid:...]`` thread key (``b"157801 tid: 0x7f.."``), None if absent."""
    if not tkey:
        return None
    try:
        return int(tkey.split(None, 1)[0])
    except ValueError:
        return None


def _timestamp(line: bytes | None) -> int | None:
    """The ``%010lu us`` field of a log line."""
    if line is None:
        return None
    u = line.find(b" us: ", 0, 160)
    if u < 0:
        return None
    start = line.rfind(b":", 0, u)
    try:
        return int(line[start + 1 : u])
    except ValueError:
        return None


def _shape(m: re.Match[bytes] | None) -> tuple[int, int, int] | None:
    if m is None:
        return None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)))


def _add_shape(counter: Counter[Any], shape: tuple[int, int, int] | None, count: int) -> None:
    if shape is None:
        return
    if shape in counter or len(counter) < MAX_SHAPES_PER_KERNEL:
        counter[shape] += count
    else:
        counter["other"] += count


# ----------------------------------------------------------------------------------------------
# Comparing logs (Case-A vs Case-B)


def compare(summaries: list[LogSummary], top: int = 10) -> dict[str, Any]:
    """Side-by-side facts of two or more logs: counts, top kernels, what they share.

    Queue addresses belong to a process's address space, so two logs share a queue only when
    the same process (pid) used the same HWq in both; equal addresses in different processes
    are reported separately, as a coincidence of allocation and not a shared queue.
    """
    labels = [_label(i) for i in range(len(summaries))]
    rows = []

    def row(metric: str, values: list[Any]) -> None:
        rows.append({"metric": metric, "values": values})

    row("processes", [len(s.processes) for s in summaries])
    row("hardware queues", [len(s.queues) for s in summaries])
    row("queues created in log", [sum(q.created for q in s.queues.values()) for s in summaries])
    row(
        "queue priorities",
        [
            sorted({q.priority for q in s.queues.values() if q.priority is not None})
            for s in summaries
        ],
    )
    row("dispatches", [s.dispatches for s in summaries])
    row("kernel launches (ShaderName)", [s.shader_lines for s in summaries])
    row("distinct kernels", [len(s.kernels) for s in summaries])
    row("barrier packets", [s.barrier_packets for s in summaries])
    row("dispatches with barrier bit", [s.barrier_bit for s in summaries])
    row("span (s)", [s.span_s for s in summaries])
    row("dispatch rate (/s)", [s.dispatch_rate for s in summaries])
    row("unparsed lines", [s.unparsed_lines for s in summaries])

    keysets = [set(s.queues) for s in summaries]
    shared = set.intersection(*keysets) if keysets else set()
    shared_queues = [
        {"pid": pid, "hw_queue": hw} for pid, hw in sorted(shared, key=lambda k: (k[0] or 0, k[1]))
    ]
    addr_sets = [{hw for _pid, hw in ks} for ks in keysets]
    same_addr = set.intersection(*addr_sets) - {hw for _pid, hw in shared} if addr_sets else set()

    names = [set(s.kernels) for s in summaries]
    common = set.intersection(*names) if names else set()
    top_kernels = [
        [{"name": k.name, "count": max(k.count, k.dispatches)} for k in s.sorted_kernels()[:top]]
        for s in summaries
    ]
    only = {
        labels[i]: sorted(
            names[i] - set.union(*(n for j, n in enumerate(names) if j != i)),
            key=lambda n, s=summaries[i]: -max(s.kernels[n].count, s.kernels[n].dispatches),
        )[:top]
        for i in range(len(summaries))
    }
    return {
        "labels": labels,
        "paths": [s.path for s in summaries],
        "rows": rows,
        "shared_queues": shared_queues,
        "same_address_other_process": sorted(same_addr),
        "shared_kernels": len(common),
        "shared_kernel_names": sorted(common)[:top],
        "top_kernels": top_kernels,
        "kernels_only_in": only,
    }


def _label(index: int) -> str:
    return f"Case-{chr(ord('A') + index)}" if index < 26 else f"Case-{index + 1}"
