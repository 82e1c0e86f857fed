"""What a server's request pays for starting right after other GPU work, with nothing left to
wait for: the graph server's request (ResNet-50 fp16 b8 from a CUDA graph, its GPU span timed
by events before its input's copy and after its output's) after each of:

* ``idle``: 1 ms of nothing (as alone: its weights stay in the GPU's L2 between requests);
* ``own-flush``: its own process wrote 256 MiB just before (the L2 holds other data; no other
  context ran);
* ``other-spin``: another process's CUDA context ran 0.5 ms of a kernel that touches no memory
  just before (the GPU switched contexts; the L2 keeps the server's data);
* ``other-flush``: another process wrote 256 MiB just before (both, as after a trainer);
* ``other-parked``: through the request, another process's stream waits at a barrier on a
  word in host memory (``cuStreamWaitValue32``, as the gate's barriers wait) with 200 short
  kernels queued behind it, released after the request (as a held trainer's stream waits
  while the server serves its queue);
* ``other-parked-device``: the same with the word in the GPU's memory.

Every prior work completed before the request starts (nothing in flight, no barrier to reach),
so the differences to ``idle`` are what no gate can save by holding work sooner; the parked
modes tell whether a held trainer's waiting stream slows the server's graph. The modes
take turns, request by request; the medians of the GPU span and of the whole service (ms) are
printed and written to ``--out``. With ``--mps`` both processes are clients of a private MPS
daemon (started and stopped here), which runs them in one GPU context: no switch between them.

    PYTHONPATH=src python3 benchmarks/driver_gate/cold_start.py [--mps] --out cold_start.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

MODES = ("idle", "own-flush", "other-spin", "other-flush", "other-parked", "other-parked-device")
FLUSH_BYTES = 256 << 20
SPIN_CYCLES = 1_000_000  # about 0.5 ms at the H100's and H200's 1.98 GHz
QUEUED_BEHIND = 200  # short kernels behind a parked barrier


class Barrier:
    """A stream of the current CUDA context that can be parked at a ``cuStreamWaitValue32``
    on a word in host memory (mapped for the GPU, as the gate maps its words) or in the GPU's
    memory, with work queued behind, and released by writing the word."""

    def __init__(self, torch, device_word: bool) -> None:
        import ctypes

        from cuda.bindings import driver

        self.torch, self.driver, self.device_word = torch, driver, device_word
        self.stream = torch.cuda.Stream()
        if device_word:
            self.word = torch.zeros(1, dtype=torch.int32, device="cuda")
            self.address = self.word.data_ptr()
        else:
            flags = driver.CU_MEMHOSTALLOC_DEVICEMAP | driver.CU_MEMHOSTALLOC_PORTABLE
            self.host = _checked(driver.cuMemHostAlloc(4096, flags))
            self.cell = ctypes.c_uint32.from_address(int(self.host))
            self.address = int(_checked(driver.cuMemHostGetDevicePointer(self.host, 0)))

    def park(self) -> None:
        """Sets the word, queues the wait and the kernels behind it; returns at once."""
        torch, driver = self.torch, self.driver
        if self.device_word:
            self.word.fill_(1)
            torch.cuda.synchronize()
        else:
            self.cell.value = 1
        flag = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ
        handle = driver.CUstream(self.stream.cuda_stream)
        _checked(driver.cuStreamWaitValue32(handle, self.address, 0, flag))
        with torch.cuda.stream(self.stream):
            for _ in range(QUEUED_BEHIND):
                torch.cuda._sleep(1000)

    def release(self) -> None:
        """Clears the word (from another stream, for a word in the GPU's memory)."""
        if self.device_word:
            self.word.fill_(0)  # the default stream: not the parked one
        else:
            self.cell.value = 0


def _checked(answer):
    """The value of a cuda-bindings call's (error, value) answer, or SystemExit on an error."""
    err, *value = answer if isinstance(answer, tuple) else (answer,)
    if int(err) != 0:
        raise SystemExit(f"cold_start: a CUDA driver call failed ({err})")
    return value[0] if value else None


def other_context(pipe) -> None:  # a process of its own: its own CUDA context
    """Runs what the server asks for ("spin", "flush", "parked", "parked-device"), answers
    once it is done (once parked, for a barrier, which "release" then lets go); "quit" ends."""
    import torch

    buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    try:
        barriers = {"parked": Barrier(torch, False), "parked-device": Barrier(torch, True)}
    except ImportError:  # no cuda-bindings: the parked modes are not measured
        barriers = {}
    pipe.send("ready" if barriers else "ready-no-barriers")
    while (order := pipe.recv()) != "quit":
        if order == "spin":
            torch.cuda._sleep(SPIN_CYCLES)
        elif order == "flush":
            buf.fill_(1)
        else:
            barriers[order].park()
            pipe.send("parked")
            pipe.recv()  # "release"
            barriers[order].release()
        torch.cuda.synchronize()
        pipe.send("done")


def summarise(rows: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Per mode, from (GPU span, service) pairs in ms: their count, medians, and the medians'
    difference to ``idle``'s."""
    out: dict[str, dict[str, float]] = {}
    for mode, pairs in rows.items():
        span = statistics.median(p[0] for p in pairs)
        service = statistics.median(p[1] for p in pairs)
        out[mode] = {"n": len(pairs), "span_p50": span, "service_p50": service}
    base = out.get("idle")
    for figures in out.values() if base else ():
        figures["span_over_idle"] = figures["span_p50"] - base["span_p50"]
        figures["service_over_idle"] = figures["service_p50"] - base["service_p50"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="requests per mode")
    parser.add_argument("--out", type=Path, help="write the medians here as JSON")
    parser.add_argument("--mps", action="store_true", help="both processes MPS clients")
    args = parser.parse_args(argv)
    from gpreempt.bench.mps import MpsDaemon, MpsUnavailable

    if not args.mps:
        return measure(args.rounds, args.out, False)
    # The server runs in a process of its own, so that no client of the daemon is left when it
    # is told to quit: one with a client still attached outlived its directory and its quit.
    with contextlib.ExitStack() as stack:
        where = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        try:
            os.environ.update(stack.enter_context(MpsDaemon(where)).env())
        except MpsUnavailable:
            print("cold_start: MPS could not start here (nvidia-cuda-mps-control missing "
                  "or refused): run it without --mps", file=sys.stderr)  # fmt: skip
            return 2
        server = mp.get_context("spawn").Process(target=_measured, args=(args.rounds, args.out))
        server.start()
        server.join()
        return server.exitcode if server.exitcode is not None else 1


def _measured(rounds: int, out: Path | None) -> None:  # the server's process under MPS
    sys.exit(measure(rounds, out, True))


def _answer(pipe, child) -> str:
    """The other process's next answer; SystemExit, in one line, where it ended instead (its
    own error printed above)."""
    while not pipe.poll(0.5):
        if not child.is_alive():
            raise SystemExit("cold_start: the other process ended; its error is above")
    return pipe.recv()


def measure(rounds: int, out: Path | None, mps: bool) -> int:
    """Times the modes (this process's CUDA starts here, after any MPS daemon)."""
    import torch

    from gpreempt.bench.builtin_workloads import resnet50_server

    if not torch.cuda.is_available():
        print("cold_start: no CUDA GPU here", file=sys.stderr)
        return 2
    request = resnet50_server()
    spans = request.gpu_ms  # type: ignore[attr-defined]
    own = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    mine, theirs = mp.get_context("spawn").Pipe()
    child = mp.get_context("spawn").Process(target=other_context, args=(theirs,), daemon=True)
    child.start()
    try:
        ready = _answer(mine, child)
        if not ready.startswith("ready"):
            raise SystemExit("cold_start: the other process did not start")
        modes = MODES if ready == "ready" else [m for m in MODES if "parked" not in m]
        if modes != MODES:
            print("cold_start: cuda-bindings missing, the parked modes left out", file=sys.stderr)
        for _ in range(50):  # warm up
            request()
        rows: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
        for _ in range(rounds):
            for mode in modes:
                if mode == "idle":
                    time.sleep(1e-3)
                elif mode == "own-flush":
                    own.fill_(2)
                    torch.cuda.synchronize()
                else:
                    mine.send(mode.removeprefix("other-"))
                    _answer(mine, child)
                start = time.perf_counter()
                request()
                rows[mode].append((spans[-1], (time.perf_counter() - start) * 1e3))
                if "parked" in mode:
                    mine.send("release")
                    _answer(mine, child)
        mine.send("quit")
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    result = summarise(rows)
    for mode, f in result.items():
        print(f"{mode:12s} n={f['n']:4d} GPU span {f['span_p50']:.3f} ms "
              f"({f['span_over_idle']:+.3f}), service {f['service_p50']:.3f} ms "
              f"({f['service_over_idle']:+.3f})")  # fmt: skip
    if out:
        out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "mps": mps, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
