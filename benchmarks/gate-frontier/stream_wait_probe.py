"""Can a trainer's GPU stream wait on a server's activity word by itself?

A CUDA stream memory operation (``cuStreamWaitValue32``) makes the GPU hold a stream's later
work until a word of memory has a value. If the trainer puts such a wait on the server's
"request open" word into its stream every few kernels, its GPU work stops at the next wait the
moment a request opens and goes on the moment it ends, with no CPU of either process in
between, while the trainer's CPU keeps launching ahead. This probe measures whether that works
across processes and what it costs:

* phase ``idle``: the trainer launches nothing; the server's requests alone (the reference).
* phase ``parked``: the trainer's stream waits on a word that stays set, with work queued behind
  the wait: does a stream blocked on a wait slow the other process down?
* phase ``barriers``: the trainer runs matmuls without pause, a wait on the server's word every
  ``--every`` kernels, its CPU up to ``--ahead`` waits ahead; the server sets its word around
  each request. Server latency against ``idle``; trainer kernels/s against ``alone``.
* ``--lead-ms``: the server sets its word that long before its kernels (a request that
  prepares on the CPU first): does a stream held at a wait, behind which the trainer keeps
  launching (``barriers``), delay the server more than one held with nothing more launched
  behind it (``parked``)?
* ``--trainers N``: N trainer processes, each doing the same (several held contexts at once).
* phase ``unprotected``: the same, but the server does not set its word (no preemption).
* phase ``alone``/``alone-nowait``: the trainer alone with and without the waits (their cost).

The server's word lives in a shared-memory file the trainer maps read-only and registers with
the driver (``CU_MEMHOSTREGISTER_READ_ONLY``), as a gate would register a watched control block.

    python3 benchmarks/gate-frontier/stream_wait_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
import time

SHM = "/dev/shm/gpreempt-stream-wait-probe"
BUSY, PHASE, PARK, DONE = 0, 1, 2, 3  # u32 words of the shared page (DONE + i: trainer i)
PHASES = ["idle", "parked", "barriers", "unprotected", "alone", "alone-nowait", "stop"]


def words_rw() -> tuple[mmap.mmap, memoryview]:
    fd = os.open(SHM, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096)
    os.close(fd)
    return m, memoryview(m).cast("I")


def server(args: argparse.Namespace) -> None:
    import torch

    m, w = words_rw()
    for i in range(DONE + args.trainers):
        w[i] = 0
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    argv = [sys.executable, __file__, *sys.argv[1:], "--role", "trainer"]
    trainers = [subprocess.Popen([*argv, "--index", str(i)]) for i in range(args.trainers)]

    def all_done() -> bool:
        return all(w[DONE + i] for i in range(args.trainers))

    while not all_done():  # the trainers have their contexts and their registrations
        time.sleep(0.01)

    def request(busy: bool = True) -> float:
        w[BUSY] = 1 if busy else 0
        lead_end = time.perf_counter() + args.lead_ms / 1e3
        while time.perf_counter() < lead_end:  # the word is set this long before the launch
            pass
        start = time.perf_counter()
        for _ in range(args.server_kernels):
            torch.mm(x, x)
        torch.cuda.synchronize()
        w[BUSY] = 0
        return (time.perf_counter() - start) * 1e3

    for _ in range(50):
        request()
    out: dict = {"args": vars(args), "phases": {}}
    for phase in PHASES[:-1]:
        w[PARK] = 1 if phase == "parked" else 0
        for i in range(args.trainers):
            w[DONE + i] = 0
        w[PHASE] = PHASES.index(phase) + 1
        time.sleep(0.5)  # the trainer settles into the phase
        lat = []
        if phase in ("idle", "parked", "barriers", "unprotected"):
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                lat.append(request(busy=phase != "unprotected"))
                time.sleep(args.gap_ms / 1e3)
        else:
            time.sleep(args.seconds)
        w[PHASE] = 0
        w[PARK] = 0
        while not all_done():
            time.sleep(0.001)
        reports = []
        for i in range(args.trainers):
            with open(f"{SHM}.trainer{i}") as f:
                reports.append(json.load(f))
        report = {
            key: sum(r[key] for r in reports) for key in ("kernels", "waits", "kernels_per_s")
        }
        lat.sort()
        out["phases"][phase] = {
            "server_ms": lat,
            "server_p50": lat[len(lat) // 2] if lat else None,
            "server_p99": lat[int(len(lat) * 0.99)] if lat else None,
            **report,
        }
        print(phase, {k: v for k, v in out["phases"][phase].items() if k != "server_ms"})
    w[PHASE] = PHASES.index("stop") + 1
    for trainer in trainers:
        trainer.wait(30)
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"{'phase':14} {'server P50':>10} {'P99 ms':>8} {'trainer k/s':>12}")
    for phase, r in out["phases"].items():
        p50 = r["server_p50"] or 0
        p99 = r["server_p99"] or 0
        print(f"{phase:14} {p50:10.3f} {p99:8.3f} {r['kernels_per_s']:12.0f}")


def trainer(args: argparse.Namespace) -> None:
    import torch
    from cuda.bindings import driver as cu

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    fd = os.open(SHM, os.O_RDONLY)
    addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    words = (ctypes.c_uint32 * 64).from_address(addr)
    y = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    flags = getattr(cu, "CU_MEMHOSTREGISTER_DEVICEMAP", 2) | getattr(
        cu, "CU_MEMHOSTREGISTER_READ_ONLY", 8
    )
    (err,) = cu.cuMemHostRegister(addr, 4096, flags)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    err, dptr = cu.cuMemHostGetDevicePointer(addr, 0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    eq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ

    def wait_on(word: int) -> None:
        (e,) = cu.cuStreamWaitValue32(stream, int(dptr) + 4 * word, 0, eq)
        assert e == cu.CUresult.CUDA_SUCCESS, e

    _m, rw = words_rw()  # the trainer's own writes (DONE) go through a writable mapping
    done = DONE + args.index
    rw[done] = 1  # ready
    while True:
        index = words[PHASE]
        if index == 0:
            time.sleep(0.0005)
            continue
        phase = PHASES[index - 1]
        if phase == "stop":
            return
        kernels, waits, start = 0, 0, time.perf_counter()
        events: list = []
        if phase == "parked":
            wait_on(PARK)
            for _ in range(200):
                torch.mm(y, y)
            kernels = 200
        while phase != "parked" and phase != "idle" and words[PHASE] == index:
            if phase in ("barriers", "unprotected", "alone"):
                wait_on(BUSY)
                waits += 1
            for _ in range(args.every):
                torch.mm(y, y)
            kernels += args.every
            ev = torch.cuda.Event()
            ev.record()
            events.append(ev)
            if len(events) > args.ahead:
                events.pop(0).synchronize()
        while words[PHASE] == index:
            time.sleep(0.0005)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        with open(f"{SHM}.trainer{args.index}", "w") as f:
            json.dump({"kernels": kernels, "waits": waits, "seconds": seconds,
                       "kernels_per_s": kernels / seconds}, f)  # fmt: skip
        rw[done] = 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="server", choices=["server", "trainer"])
    parser.add_argument("--out", default="stream_wait_probe.json")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--gap-ms", type=float, default=1.0, help="pause between requests")
    parser.add_argument("--server-kernels", type=int, default=24, help="matmuls per request")
    parser.add_argument("--every", type=int, default=4, help="trainer kernels between waits")
    parser.add_argument(
        "--lead-ms",
        type=float,
        default=0.0,
        help="the server sets its word this long before "
        "it launches (the clock starts at the launch)",
    )
    parser.add_argument("--ahead", type=int, default=64, help="waits the trainer's CPU runs ahead")
    parser.add_argument("--trainers", type=int, default=1, help="trainer processes")
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    (server if args.role == "server" else trainer)(args)


if __name__ == "__main__":
    main()
