"""Synthetic HIP/CLR logs in the runtime's exact line format, for tests and speed checks.

Lines follow ROCm/clr ``amd::log_printf``: ``:%d:%-25s:%-4d: %010lu us: %s %s`` where the
first ``%s`` is ``[pid:%d tid: 0x%5x]`` when the log level is 4 or more and empty otherwise
(so a level-3 log has two spaces after ``us:``). Messages copy the runtime's format strings.

The content is made up (queue addresses, kernel names, timings); the format is not. Nothing
here is a measurement.

Usage: ``python -m gpreempt.monitor.synthetic_log OUT [--mb 100] [--processes 2] [--gzip]``.
"""

from __future__ import annotations

import argparse
import gzip
import random
from collections.abc import Iterator
from dataclasses import dataclass

KERNELS = (
    ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_AFC1", 1216),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        1024,
    ),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        256,
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
        "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >("
        "at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
        "unsigned int, float, 4>)",
        512,
    ),
    ("naive_conv_fwd_nchw_float_double_float", 256),
    ("MIOpenBatchNormFwdTrainSpatial", 1024),
)


def log_line(
    level: int,
    file: str,
    line: int,
    us: int,
    message: str,
    pid: int | None = None,
    tid: int | None = None,
) -> str:
    """One runtime log line, as ``amd::log_printf`` formats it (without the newline).

    ``pid``/``tid`` given: the ``AMD_LOG_LEVEL >= 4`` form ``[pid:%d tid: 0x%5x]``
    (``std::setw(5)`` pads short thread ids with spaces).
    """
    pidtid = f"[pid:{pid} tid: 0x{tid:5x}]" if pid is not None and tid is not None else ""
    return f":{level}:{file:<25}:{line:<4}: {us:010d} us: {pidtid} {message}"


@dataclass
class _Queue:
    sw: int
    hw: int
    qid: int
    rptr: int = 0


def dispatch_message(
    q: _Queue, grid: tuple[int, int, int], wg: tuple[int, int, int], barrier: int = 1
) -> str:
    header = 0x2 | (barrier << 8) | (1 << 9) | (1 << 11)
    q.rptr += 1
    return (
        f"SWq=0x{q.sw:x}, HWq=0x{q.hw:x}, id={q.qid}, Dispatch Header = 0x{header:x} "
        f"(type=2, barrier={barrier}, acquire=1, release=1), setup=3, "
        f"grid=[{grid[0]}, {grid[1]}, {grid[2]}], workgroup=[{wg[0]}, {wg[1]}, {wg[2]}], "
        f"private_seg_size=0, group_seg_size=0, kernel_obj=0x7f3b2c0a{q.rptr % 4096:04x}, "
        f"kernarg_address=0x7f3a94{q.rptr % 65536:06x}, completion_signal=0x0, "
        f"correlation_id=0, rptr={q.rptr - 1}, wptr={q.rptr}"
    )


def generate(
    target_bytes: int,
    processes: int = 2,
    level: int = 4,
    seed: int = 1,
) -> Iterator[str]:
    """Lines of an interleaved multi-process log until about ``target_bytes`` are produced."""
    rng = random.Random(seed)
    t = 5_780_000_000
    procs = []
    for i in range(processes):
        pid = 157_801 + 17 * i
        tid = 0x7FAD66C00000 + 0x100000 * i
        qs = [
            _Queue(sw=0x7FAF945B8000 + 0x2000 * j + i, hw=0x7FAD66C00000 + 0x400000 * j, qid=j + 1)
            for j in range(1 + i % 2)
        ]
        procs.append((pid, tid, qs))
    produced = 0
    lvl_pid = level >= 4
    for pid, tid, qs in procs:
        p, th = (pid, tid) if lvl_pid else (None, None)
        yield log_line(
            3,
            "rocdevice.cpp",
            2870,
            t,
            "Number of allocated hardware queues with low priority: 0, with normal priority: 0, "
            "with high priority: 0, maximum per priority is: 4",
            p,
            th,
        )
        for prio, q in zip((1, 2), qs, strict=False):
            yield log_line(
                3,
                "rocdevice.cpp",
                2951,
                t,
                f"Created SWq=0x{q.sw:x} to map on HWq=0x{q.hw:x} with size 16384 with priority "
                f"{prio}, cooperative: 0",
                p,
                th,
            )
            yield log_line(
                3, "rocdevice.cpp", 3045, t, f"acquireQueue refCount: 0x{q.hw:x} (1)", p, th
            )
    while produced < target_bytes:
        pid, tid, qs = procs[rng.randrange(len(procs))]
        p, th = (pid, tid) if lvl_pid else (None, None)
        q = qs[rng.randrange(len(qs))]
        name, wg = KERNELS[rng.randrange(len(KERNELS))]
        grid = (wg * rng.choice((80, 160, 304)), 1, 1)
        t += rng.randrange(3, 40)
        lines = [
            log_line(
                3,
                "hip_module.cpp",
                663,
                t,
                f"\x1b[32m hipLaunchKernel ( 0x55d5a0, {{{grid[0] // wg},1,1}}, {{{wg},1,1}}, "
                f"0x7ffd2c0, 0, stream:0x{q.sw:x} )\x1b[0m",
                p,
                th,
            ),
            log_line(3, "rocvirtual.cpp", 3596, t, f"ShaderName : {name}", p, th),
        ]
        if level >= 4:
            lines.append(
                log_line(4, "rocvirtual.cpp", 1177, t, dispatch_message(q, grid, (wg, 1, 1)), p, th)
            )
        if level >= 5:
            lines.append(
                log_line(
                    5,
                    "command.cpp",
                    355,
                    t,
                    f"Command (KernelExecution) enqueued: 0xd176c10 to queue: 0x{q.sw:x}",
                    p,
                    th,
                )
            )
        lines.append(
            log_line(
                3, "hip_module.cpp", 664, t + 2, "hipLaunchKernel: Returned hipSuccess : ", p, th
            )
        )
        for line in lines:
            produced += len(line) + 1
            yield line


def write(
    path: str, target_bytes: int, processes: int = 2, level: int = 4, use_gzip: bool = False
) -> int:
    """Write a synthetic log; returns bytes of log text written (before compression)."""
    opener = gzip.open if use_gzip else open
    n = 0
    with opener(path, "wt", encoding="utf-8") as f:  # type: ignore[operator]
        buf = []
        for line in generate(target_bytes, processes=processes, level=level):
            buf.append(line)
            n += len(line) + 1
            if len(buf) >= 10_000:
                f.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            f.write("\n".join(buf) + "\n")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a synthetic HIP runtime log.")
    parser.add_argument("out")
    parser.add_argument("--mb", type=float, default=100.0, help="size in MB (default 100)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--level", type=int, default=4, choices=(3, 4, 5))
    parser.add_argument("--gzip", action="store_true")
    args = parser.parse_args(argv)
    n = write(args.out, int(args.mb * 1e6), args.processes, args.level, args.gzip)
    print(f"wrote {n / 1e6:.1f} MB of log text to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
