"""When does the GPU read a stream barrier's word: when the work before it has completed, or
as soon as it reaches the barrier in the stream's commands, while that work still runs?

One stream runs SPIN_MS of spinning kernels (one kernel, or several in a row), then a stream
barrier (go on while a host word is 0), then a kernel that bumps a counter in host memory. The
word is 0 when all of it is queued and raised SET_MS into the spin, long before the spin ends.
If the GPU reads the word only once the spin has completed, the counter stays 0 while the word
is raised; if it reads it as soon as it reaches the barrier, the counter kernel runs although
the word was raised before its turn came: a barrier would then let through the work queued
after it, and the gate's check that barriers hold (driver_verify.cpp) would see a barrier
passed while the word stayed raised.

The barrier is ``cuStreamWaitValue32``, preceded by nothing, an event without timing, a timed
event or a ``cuStreamWriteValue32`` to a scratch word (a *fence*), or it is the driver-level
gate's own: one 64-bit wait in ``cuStreamBatchMemOp`` on a pair of words, the second raised
(``pair``). The control never raises the word: there the kernel after the barrier must run in
every trial; in every variant it must have run once the word is down again and the stream
synchronised (``ran_once_released``), or the counts prove nothing.

    python3 benchmarks/driver_gate/wait_order.py --out wait_order.json

Needs CuPy and an NVIDIA GPU; about 20 s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import cupy as cp

SPIN_MS = 3.0
SET_MS = 0.5
CU_STREAM_WAIT_VALUE_EQ = 0x1
CU_STREAM_MEM_OP_WAIT_VALUE_64 = 4
VARIANTS = ("control", "none", "event", "timed-event", "write-value", "pair")
#: Offsets in the mapped page: the 32-bit word, the counter, a scratch word, the pair.
WORD, COUNT, SCRATCH, PAIR = 0, 8, 16, 32


class _WaitValue(ctypes.Structure):
    """CUstreamMemOpWaitValueParams_st (cuda.h); the union it lies in is 48 bytes."""

    _fields_ = [
        ("operation", ctypes.c_int),
        ("address", ctypes.c_uint64),
        ("value64", ctypes.c_uint64),
        ("flags", ctypes.c_uint),
        ("alias", ctypes.c_uint64),
    ]


class _BatchMemOpParams(ctypes.Union):
    _fields_ = [("waitValue", _WaitValue), ("pad", ctypes.c_uint64 * 6)]


def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    names = {
        "wait32": ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"),
        "write32": ("cuStreamWriteValue32_v2", "cuStreamWriteValue32"),
        "batch": ("cuStreamBatchMemOp_v2", "cuStreamBatchMemOp"),
    }
    for attr, candidates in names.items():
        setattr(lib, attr, next(getattr(lib, n) for n in candidates if hasattr(lib, n)))
    for fn in (lib.wait32, lib.write32):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
    lib.batch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]
    lib.batch.restype = ctypes.c_int
    return lib


KERNELS = r"""
extern "C" __global__ void spin(long long cycles) {
  long long t = clock64(); while (clock64() - t < cycles) {}
}
extern "C" __global__ void bump(unsigned long long* c) {
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(c, 1ULL);
}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kernels", default="1,8", help="spinning kernels before the barrier")
    parser.add_argument("--out", help="where to write the counts (JSON)")
    args = parser.parse_args()
    lib = _driver()
    module = cp.RawModule(code=KERNELS)
    spin, bump = module.get_function("spin"), module.get_function("bump")
    clock_khz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"]
    host = cp.cuda.runtime.hostAlloc(4096, 2)  # mapped: the same address on the GPU (UVA)
    count = ctypes.c_uint64.from_address(host + COUNT)
    stream = cp.cuda.Stream(non_blocking=True)
    handle = ctypes.c_void_p(stream.ptr)
    plain = cp.cuda.Event(disable_timing=True)
    timed = cp.cuda.Event()
    pair_op = _BatchMemOpParams()
    pair_op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64
    pair_op.waitValue.address = host + PAIR
    pair_op.waitValue.value64 = 0
    pair_op.waitValue.flags = CU_STREAM_WAIT_VALUE_EQ
    results: dict[str, dict[str, int]] = {}
    for kernels in (int(k) for k in args.kernels.split(",")):
        cycles = int(SPIN_MS * clock_khz / kernels)
        for variant in VARIANTS:
            # the pair's second word is the one raised, as a server's auto_active is
            raised = ctypes.c_uint32.from_address(host + (PAIR + 4 if variant == "pair" else WORD))
            ran = released = 0
            for trial in range(args.trials + 1):  # the first warms up
                raised.value, count.value = 0, 0
                for _ in range(kernels):
                    spin((1,), (32,), (cp.int64(cycles),), stream=stream)
                if variant == "event":
                    plain.record(stream)
                elif variant == "timed-event":
                    timed.record(stream)
                elif variant == "write-value":
                    assert lib.write32(handle, host + SCRATCH, trial, 0) == 0
                if variant == "pair":
                    assert lib.batch(handle, 1, ctypes.byref(pair_op), 0) == 0
                else:
                    assert lib.wait32(handle, host + WORD, 0, CU_STREAM_WAIT_VALUE_EQ) == 0
                bump((1,), (32,), (cp.uint64(host + COUNT),), stream=stream)
                time.sleep(SET_MS / 1e3)
                raised.value = 0 if variant == "control" else 1
                time.sleep(SPIN_MS / 1e3 * 3)
                passed = count.value
                raised.value = 0
                stream.synchronize()
                if trial > 0:
                    ran += passed
                    released += count.value  # the word down again: it must have run by now
            name = f"{variant}, {kernels} kernel{'s' if kernels > 1 else ''}"
            results[name] = {
                "trials": args.trials,
                "ran_after_the_barrier": ran,
                "ran_once_released": released,
            }
            print(f"{name:28s} the kernel after the barrier ran in {ran} of {args.trials} trials")
    controls_ok = all(
        r["ran_once_released"] == args.trials
        and (not name.startswith("control") or r["ran_after_the_barrier"] == args.trials)
        for name, r in results.items()
    )
    if not controls_ok:
        print("the kernel after the barrier did not always run: the counts prove nothing")
    if args.out:
        name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        found = {
            "spin_ms": SPIN_MS,
            "set_ms": SET_MS,
            "device": name,
            "controls_ok": controls_ok,
            "variants": results,
        }
        with open(args.out, "w") as f:
            json.dump(found, f, indent=1)
    return 0 if controls_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
