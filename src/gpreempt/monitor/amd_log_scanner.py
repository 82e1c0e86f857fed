"""The hot loop of :mod:`.amd_log`: lines of a HIP/CLR runtime log into a :class:`LogSummary`.

Built for multi-gigabyte logs: a cheap substring test before any parsing, and dispatch lines
counted by their raw text (the part that names queue, header, grid and workgroup), which is
parsed once per distinct text. Memory stays bounded: the distinct texts are folded into totals
whenever they grow large. The line formats are described in :mod:`.amd_log`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from .amd_log_summary import LogSummary, ProcessStats

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

#: HSA fence scopes in the dispatch header's acquire/release fields.
FENCE_SCOPES = {0: "none", 1: "agent", 2: "system"}


class LogScanner:
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
