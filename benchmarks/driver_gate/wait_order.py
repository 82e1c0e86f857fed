"""When does the GPU read a stream barrier's word: when the work before it has completed, or
as soon as that work has started?

One stream runs a kernel that spins SPIN_MS, then a stream barrier (``cuStreamWaitValue32``:
go on while a host word is 0), then a kernel that bumps a counter in host memory. The word is
0 when all of it is queued and raised SET_MS into the spin, long before the spin ends. If the
GPU evaluates the wait only once the spin has completed, the counter stays 0 while the word
is raised; if it evaluates it as soon as it reaches it in the stream's command list, while the
spin still runs, the counter kernel runs although the word was raised before its turn came.
Each variant puts something else between the spin and the wait (a *fence*): nothing, an event
without timing, a timed event, or a ``cuStreamWriteValue32`` to a scratch word. The control
never raises the word: there the kernel after the barrier must run in every trial, or the probe
proves nothing.

    python3 benchmarks/driver_gate/wait_order.py --out wait_order.json

Needs CuPy and an NVIDIA GPU.
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
VARIANTS = ("control", "none", "event", "timed-event", "write-value")


def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
        if hasattr(lib, name):
            lib.wait32 = getattr(lib, name)
            break
    for name in ("cuStreamWriteValue32_v2", "cuStreamWriteValue32"):
        if hasattr(lib, name):
            lib.write32 = getattr(lib, name)
            break
    for fn in (lib.wait32, lib.write32):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
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
    parser.add_argument("--out", help="where to write the counts (JSON)")
    args = parser.parse_args()
    lib = _driver()
    module = cp.RawModule(code=KERNELS)
    spin, bump = module.get_function("spin"), module.get_function("bump")
    clock_khz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"]
    cycles = int(SPIN_MS * clock_khz)
    host = cp.cuda.runtime.hostAlloc(64, 2)  # mapped: the same address on the GPU (UVA)
    word = ctypes.c_uint32.from_address(host)
    count = ctypes.c_uint64.from_address(host + 8)
    stream = cp.cuda.Stream(non_blocking=True)
    handle = ctypes.c_void_p(stream.ptr)
    plain = cp.cuda.Event(disable_timing=True)
    timed = cp.cuda.Event()
    results = {}
    for variant in VARIANTS:
        ran = released = 0
        for trial in range(args.trials + 1):  # the first warms up
            word.value, count.value = 0, 0
            spin((1,), (32,), (cp.int64(cycles),), stream=stream)
            if variant == "event":
                plain.record(stream)
            elif variant == "timed-event":
                timed.record(stream)
            elif variant == "write-value":
                assert lib.write32(handle, host + 16, trial, 0) == 0
            assert lib.wait32(handle, host, 0, CU_STREAM_WAIT_VALUE_EQ) == 0
            bump((1,), (32,), (cp.uint64(host + 8),), stream=stream)
            time.sleep(SET_MS / 1e3)
            word.value = 0 if variant == "control" else 1
            time.sleep(SPIN_MS / 1e3 * 3)
            passed = count.value
            word.value = 0
            stream.synchronize()
            if trial > 0:
                ran += passed
                released += count.value  # the word down again: it must have run by now
        results[variant] = {
            "trials": args.trials,
            "ran_after_the_barrier": ran,
            "ran_once_released": released,
        }
        print(f"{variant:12s} the kernel after the barrier ran in {ran} of {args.trials} trials")
    if results["control"]["ran_after_the_barrier"] != args.trials or any(
        r["ran_once_released"] != args.trials for r in results.values()
    ):
        print("the kernel after the barrier did not always run: the counts prove nothing")
    if args.out:
        name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        found = {"spin_ms": SPIN_MS, "set_ms": SET_MS, "device": name, "variants": results}
        with open(args.out, "w") as f:
            json.dump(found, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
