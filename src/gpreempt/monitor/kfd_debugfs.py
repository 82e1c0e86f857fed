"""The AMD KFD debugfs views of queues: ``/sys/kernel/debug/kfd/mqds`` and ``hqds``.

Formats (amdkfd ``kfd_process.c``, ``kfd_process_queue_manager.c``,
``kfd_device_queue_manager.c``, ``kfd_topology.c``):

``mqds`` lists each process and the memory queue descriptors (MQDs) of its queues::

    Process 4242 PASID 0x8001:
      Compute queue on device 6c2b
        00000000: c0310800 00000000 00000000 ...     (seq_hex_dump, 8 words a row)
      SDMA queue on device 6c2b
        ...
      DIQ on device 6c2b

No queue id is printed. On multi-XCC parts (MI300) a compute queue's dump holds one MQD per
XCC, each restarting at offset 00000000. Older kernels print the PASID in decimal.

``hqds`` dumps the hardware queue descriptors (HQD registers) of every GPU node::

    Node 1, gpu_id 6c2b:
       Inst 0, HIQ on MEC 2 Pipe 1 Queue 0
        0000c914: 00000000 00000000 00000001 ...     (register byte address: values)
     Inst 0,  CP Pipe 0, Queue 0
        ...
      SDMA Engine 0, RLC 0
        ...

or `` Device is stopped`` under a node whose scheduler is stopped.

Decoding: a CP HQD dump starts at ``CP_MQD_BASE_ADDR``, so its third register is
``CP_HQD_ACTIVE`` (bit 0: queue active), then ``CP_HQD_VMID``, ``CP_HQD_PERSISTENT_STATE``,
``CP_HQD_PIPE_PRIORITY``, ``CP_HQD_QUEUE_PRIORITY``, ``CP_HQD_QUANTUM``,
``CP_HQD_PQ_BASE(_HI)``, ``CP_HQD_PQ_RPTR`` (the same order as the MQD from dword 128 on, on
gfx9/10/11). A compute MQD has those fields at dwords 128+: its ``CP_HQD_PQ_BASE`` is the ring
buffer address >> 8, the ``HWq=`` address in HIP logs, which ties a KFD queue to a log's queue.
An SDMA RLC dump starts at ``SDMAx_RLCy_RB_CNTL`` (bit 0: ring buffer enabled).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEBUGFS_KFD = Path("/sys/kernel/debug/kfd")

_PROCESS_RE = re.compile(r"^Process (\d+) PASID (0x[0-9a-fA-F]+|\d+):\s*$")
_QUEUE_RE = re.compile(r"^\s+(Compute queue|SDMA queue|DIQ) on device ([0-9a-fA-F]+)\s*$")
_BAD_QUEUE_RE = re.compile(r"^\s+Bad (?:user|kernel) queue type (-?\d+) on device ([0-9a-fA-F]+)")
_HEX_ROW_RE = re.compile(r"^\s+([0-9a-fA-F]{8}): ((?:[0-9a-fA-F]{8} ?)+)\s*$")
_NODE_RE = re.compile(r"^Node (\d+), gpu_id ([0-9a-fA-F]+):\s*$")
_HIQ_RE = re.compile(r"^\s+Inst (\d+), HIQ on MEC (\d+) Pipe (\d+) Queue (\d+)\s*$")
_CP_RE = re.compile(r"^\s+Inst (\d+),\s+CP Pipe (\d+), Queue (\d+)\s*$")
_SDMA_RE = re.compile(r"^\s+SDMA Engine (\d+), RLC (\d+)\s*$")
_STOPPED_RE = re.compile(r"^\s+Device is stopped\s*$")

QUEUE_TYPES = {"Compute queue": "compute", "SDMA queue": "sdma", "DIQ": "diq"}

#: Dword index of ``cp_mqd_base_addr_lo`` in a gfx9/10/11 compute MQD; the HQD fields follow.
MQD_HQD_BASE = 128
#: Offsets from ``CP_MQD_BASE_ADDR`` (in registers, and in MQD dwords from MQD_HQD_BASE).
HQD_ACTIVE = 2
HQD_VMID = 3
HQD_PIPE_PRIORITY = 5
HQD_QUEUE_PRIORITY = 6
HQD_QUANTUM = 7
HQD_PQ_BASE_LO = 8
HQD_PQ_BASE_HI = 9
HQD_PQ_RPTR = 10


# ----------------------------------------------------------------------------------------------
# mqds


@dataclass
class KfdQueue:
    """One queue of a process in ``mqds``."""

    type: str
    device: str
    #: The MQD words, one list per XCC (one for most GPUs).
    mqd_words: list[list[int]] = field(default_factory=list, repr=False)

    def hqd_field(self, index: int, xcc: int = 0) -> int | None:
        """A CP HQD field from a compute MQD (gfx9+ layout), None if not dumped."""
        if self.type != "compute" or xcc >= len(self.mqd_words):
            return None
        words = self.mqd_words[xcc]
        i = MQD_HQD_BASE + index
        return words[i] if i < len(words) else None

    @property
    def ring_address(self) -> int | None:
        """The ring buffer's address (``CP_HQD_PQ_BASE`` << 8): the HIP log's ``HWq=``."""
        lo, hi = self.hqd_field(HQD_PQ_BASE_LO), self.hqd_field(HQD_PQ_BASE_HI)
        if lo is None or hi is None:
            return None
        return ((hi << 32) | lo) << 8

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "device": self.device, "xcc": len(self.mqd_words)}
        if self.type == "compute":
            ring = self.ring_address
            active = self.hqd_field(HQD_ACTIVE)
            out.update(
                {
                    "ring_address": f"0x{ring:x}" if ring is not None else None,
                    "queue_priority": _masked(self.hqd_field(HQD_QUEUE_PRIORITY), 0xF),
                    "pipe_priority": _masked(self.hqd_field(HQD_PIPE_PRIORITY), 0x3),
                    "vmid": _masked(self.hqd_field(HQD_VMID), 0xF),
                    "mqd_active": None if active is None else bool(active & 1),
                }
            )
        return out


@dataclass
class KfdProcess:
    pid: int
    pasid: str
    queues: list[KfdQueue] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "pasid": self.pasid, "queues": [q.to_dict() for q in self.queues]}


@dataclass
class MqdsView:
    processes: list[KfdProcess] = field(default_factory=list)
    unparsed_lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "processes": [p.to_dict() for p in self.processes],
            "unparsed_lines": self.unparsed_lines,
        }


def parse_mqds(text: str) -> MqdsView:
    """Parse the text of ``/sys/kernel/debug/kfd/mqds``."""
    view = MqdsView()
    proc: KfdProcess | None = None
    queue: KfdQueue | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _HEX_ROW_RE.match(line)
        if m is not None:
            if queue is None:
                view.unparsed_lines += 1
                continue
            offset = int(m.group(1), 16)
            if offset == 0 or not queue.mqd_words:
                queue.mqd_words.append([])
            queue.mqd_words[-1].extend(int(w, 16) for w in m.group(2).split())
            continue
        m = _PROCESS_RE.match(line)
        if m is not None:
            proc = KfdProcess(pid=int(m.group(1)), pasid=m.group(2))
            view.processes.append(proc)
            queue = None
            continue
        m = _QUEUE_RE.match(line)
        if m is not None and proc is not None:
            queue = KfdQueue(type=QUEUE_TYPES[m.group(1)], device=m.group(2))
            proc.queues.append(queue)
            continue
        m = _BAD_QUEUE_RE.match(line)
        if m is not None and proc is not None:
            queue = KfdQueue(type=f"unknown({m.group(1)})", device=m.group(2))
            proc.queues.append(queue)
            continue
        view.unparsed_lines += 1
    return view


# ----------------------------------------------------------------------------------------------
# hqds


@dataclass
class Hqd:
    """One hardware queue slot's register dump."""

    kind: str  # "hiq", "cp", "sdma"
    inst: int | None
    pipe: int | None
    queue: int | None
    mec: int | None = None
    engine: int | None = None
    rlc: int | None = None
    registers: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def reg(self, index: int) -> int | None:
        return self.registers[index][1] if index < len(self.registers) else None

    @property
    def active(self) -> bool | None:
        """CP: ``CP_HQD_ACTIVE`` bit 0; SDMA: ``RB_CNTL`` bit 0 (ring buffer enabled)."""
        value = self.reg(0 if self.kind == "sdma" else HQD_ACTIVE)
        return None if value is None else bool(value & 1)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "active": self.active}
        if self.kind == "sdma":
            out.update({"engine": self.engine, "rlc": self.rlc})
        else:
            out.update({"inst": self.inst, "pipe": self.pipe, "queue": self.queue})
            if self.kind == "hiq":
                out["mec"] = self.mec
            if self.active:
                base_lo, base_hi = self.reg(HQD_PQ_BASE_LO), self.reg(HQD_PQ_BASE_HI)
                out.update(
                    {
                        "vmid": _masked(self.reg(HQD_VMID), 0xF),
                        "queue_priority": _masked(self.reg(HQD_QUEUE_PRIORITY), 0xF),
                        "ring_address": (
                            f"0x{((base_hi << 32) | base_lo) << 8:x}"
                            if base_lo is not None and base_hi is not None
                            else None
                        ),
                        "rptr": self.reg(HQD_PQ_RPTR),
                    }
                )
        return out


@dataclass
class HqdNode:
    node: int
    gpu_id: str
    stopped: bool = False
    hqds: list[Hqd] = field(default_factory=list)

    def active_per_pipe(self) -> dict[str, int]:
        """Active compute HQDs per ``inst/pipe`` (HIQ excluded)."""
        out: dict[str, int] = {}
        for h in self.hqds:
            if h.kind == "cp":
                key = f"inst{h.inst}/pipe{h.pipe}"
                out[key] = out.get(key, 0) + (1 if h.active else 0)
        return out

    def to_dict(self, all_hqds: bool = False) -> dict[str, Any]:
        cp = [h for h in self.hqds if h.kind == "cp"]
        sdma = [h for h in self.hqds if h.kind == "sdma"]
        shown = self.hqds if all_hqds else [h for h in self.hqds if h.active]
        return {
            "node": self.node,
            "gpu_id": self.gpu_id,
            "stopped": self.stopped,
            "cp_slots": len(cp),
            "cp_active": sum(1 for h in cp if h.active),
            "sdma_slots": len(sdma),
            "sdma_active": sum(1 for h in sdma if h.active),
            "active_per_pipe": self.active_per_pipe(),
            "hqds": [h.to_dict() for h in shown],
        }


@dataclass
class HqdsView:
    nodes: list[HqdNode] = field(default_factory=list)
    unparsed_lines: int = 0

    @property
    def stopped_devices(self) -> list[str]:
        return [n.gpu_id for n in self.nodes if n.stopped]

    def to_dict(self, all_hqds: bool = False) -> dict[str, Any]:
        return {
            "nodes": [n.to_dict(all_hqds) for n in self.nodes],
            "stopped_devices": self.stopped_devices,
            "unparsed_lines": self.unparsed_lines,
        }


def parse_hqds(text: str) -> HqdsView:
    """Parse the text of ``/sys/kernel/debug/kfd/hqds``."""
    view = HqdsView()
    node: HqdNode | None = None
    hqd: Hqd | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _HEX_ROW_RE.match(line)
        if m is not None:
            if hqd is None:
                view.unparsed_lines += 1
                continue
            addr = int(m.group(1), 16)
            for i, word in enumerate(m.group(2).split()):
                hqd.registers.append((addr + 4 * i, int(word, 16)))
            continue
        m = _NODE_RE.match(line)
        if m is not None:
            node = HqdNode(node=int(m.group(1)), gpu_id=m.group(2))
            view.nodes.append(node)
            hqd = None
            continue
        if node is None:
            view.unparsed_lines += 1
            continue
        if _STOPPED_RE.match(line):
            node.stopped = True
            hqd = None
            continue
        m = _CP_RE.match(line)
        if m is not None:
            hqd = Hqd("cp", int(m.group(1)), int(m.group(2)), int(m.group(3)))
            node.hqds.append(hqd)
            continue
        m = _HIQ_RE.match(line)
        if m is not None:
            hqd = Hqd("hiq", int(m.group(1)), int(m.group(3)), int(m.group(4)), mec=int(m.group(2)))
            node.hqds.append(hqd)
            continue
        m = _SDMA_RE.match(line)
        if m is not None:
            hqd = Hqd("sdma", None, None, None, engine=int(m.group(1)), rlc=int(m.group(2)))
            node.hqds.append(hqd)
            continue
        view.unparsed_lines += 1
    return view


# ----------------------------------------------------------------------------------------------
# Reading the live files, with a reason when that is not possible


class SourceUnavailable(Exception):
    """A debugfs file cannot be read; the message says why and what to do."""


def read_debugfs(name: str, root: Path = DEBUGFS_KFD) -> str:
    """Read ``root/name`` or raise SourceUnavailable saying why (not root, no debugfs, ...)."""
    path = root / name
    try:
        return path.read_text(errors="replace")
    except PermissionError:
        if os.geteuid() != 0:
            raise SourceUnavailable(
                f"{path}: permission denied (debugfs is readable by root only); "
                f"run with sudo, or save a copy (`sudo cat {path} > {name}.txt`) and pass "
                f"--{name} {name}.txt"
            ) from None
        raise SourceUnavailable(f"{path}: permission denied even as root") from None
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SourceUnavailable(f"{path}: {exc.strerror or exc}") from None
    debugfs = root.parent
    if not debugfs.exists() or not _is_mounted(debugfs):
        raise SourceUnavailable(
            f"{path}: debugfs is not mounted at {debugfs}; mount it with "
            f"`sudo mount -t debugfs none {debugfs}`"
        )
    if not root.exists():
        if os.geteuid() != 0 and not os.access(debugfs, os.X_OK):
            raise SourceUnavailable(
                f"{path}: {debugfs} is not readable by this user (root only); run with sudo"
            )
        if not Path("/dev/kfd").exists():
            raise SourceUnavailable(
                f"{path}: no AMD KFD driver here (no /dev/kfd, no {root}); "
                "this machine has no ROCm-capable GPU driver loaded"
            )
        raise SourceUnavailable(
            f"{path}: {root} does not exist (the amdgpu kernel driver was built without "
            "CONFIG_DEBUG_FS, or is not loaded)"
        )
    raise SourceUnavailable(f"{path}: not present in {root} (older or newer KFD?)")


def _is_mounted(path: Path) -> bool:
    try:
        with open("/proc/mounts") as f:
            return any(line.split()[1] == str(path) for line in f if len(line.split()) > 2)
    except OSError:
        return True  # cannot tell; let the caller's next check speak


def _masked(value: int | None, mask: int) -> int | None:
    return None if value is None else value & mask
