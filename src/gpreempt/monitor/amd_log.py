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

The counting is :mod:`.amd_log_scanner`'s (built for multi-gigabyte logs, in bounded memory),
its result a :class:`~.amd_log_summary.LogSummary`; :mod:`.amd_log_compare` sets several logs
side by side.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from .amd_log_scanner import LogScanner
from .amd_log_summary import LogSummary

#: Bytes read per block: large enough that per-block overhead vanishes.
BLOCK_SIZE = 4 << 20


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
    scan = LogScanner(LogSummary(path=path))
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
