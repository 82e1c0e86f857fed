"""Sample one GPU's SM clock, power, temperature and clock-event reasons, and the host's CPU
contention, to tell a request slowed by the GPU's own clocks, by work beside it on the GPU, or
by a CPU that did not run its process in time.

Each line of the output is one JSON array: wall time (s, as the bench's requests are timed),
SM clock (MHz), power (mW, the driver's own average), temperature (C), the clock-event reasons
(NVML's bitmask: 0 none, 1 idle, others throttling), utilisation (%), then the host's: tasks
runnable (``procs_running`` of ``/proc/stat``, the sampler among them), the time some runnable
task waited for a CPU (``/proc/pressure/cpu``, "some" total, us; null without pressure stall
information), the CPU time the hypervisor took from this machine (steal, s, all CPUs; null
where not counted) and the time this process's cgroup was throttled by its CPU limit
(``cpu.stat``'s ``throttled_usec``, s; null without cgroup v2's CPU controller); then the
sampler's own timings, which tell how a slower CPU side shows: how late its last sleep woke
(ms over what it asked: a CPU that was idle coming back late), how long the NVML reads took
(ms: the driver's own calls) and how long a fixed piece of pure-Python work took (us: the
CPU's speed while this process runs).
One sample every ``--every-ms`` (2 by default; NVML's calls make it about 2.2).
``held_progress.py --clocks FILE`` reads it beside a bench run.

    python3 benchmarks/driver_gate/gpu_clocks.py --out clocks.jsonl --seconds 560 &
    OUT=dir bash benchmarks/driver_gate/run.sh compiled
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def cgroup_cpu_stat(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> Path:
    """The ``cpu.stat`` file of this process's cgroup (cgroup v2), which may not exist."""
    try:
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return cgroups / line[3:].strip().lstrip("/") / "cpu.stat"
    except OSError:
        pass
    return cgroups / "cpu.stat"


def host_sample(proc: Path = Path("/proc"), cpu_stat: Path | None = None) -> list[float | None]:
    """The host's CPU contention now: tasks runnable, the CPU pressure's "some" total (us),
    the steal time (s, all CPUs) and the time ``cpu_stat`` (a cgroup's) says its tasks were
    throttled (s); None for what this kernel does not say."""
    runnable: float | None = None
    steal: float | None = None
    stall: float | None = None
    try:
        for line in (proc / "stat").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu" and len(fields) > 8:
                steal = int(fields[8]) / os.sysconf("SC_CLK_TCK")
            elif fields and fields[0] == "procs_running":
                runnable = int(fields[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        some = (proc / "pressure" / "cpu").read_text().splitlines()[0].split()
        stall = int(dict(f.split("=", 1) for f in some[1:] if "=" in f)["total"])
    except (OSError, ValueError, IndexError, KeyError):
        pass
    throttled: float | None = None
    try:
        stat = (cpu_stat or cgroup_cpu_stat(proc)).read_text()
        throttled = int(dict(line.split() for line in stat.splitlines())["throttled_usec"]) / 1e6
    except (OSError, ValueError, KeyError):
        pass
    return [runnable, stall, steal, throttled]


def cpu_probe_us(rounds: int = 2000) -> float:
    """How long a fixed piece of pure-Python work takes now (us): it grows where the CPU runs
    this process slower (a busy sibling thread, a lower clock, time taken by the host)."""
    start = time.perf_counter()
    total = 0
    for i in range(rounds):
        total += i * i
    return (time.perf_counter() - start) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the file to write (JSON arrays, a line each)")
    parser.add_argument("--seconds", type=float, required=True, help="how long to sample")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU's NVML index (default 0)")
    parser.add_argument("--every-ms", type=float, default=2.0, help="sampling period (default 2)")
    args = parser.parse_args(argv)
    try:
        import pynvml as nvml
    except ImportError:
        print("gpu_clocks: needs nvidia-ml-py (pip install nvidia-ml-py)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # killed: what was sampled is kept
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(args.gpu)
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # drivers before 535
    end = time.time() + args.seconds
    cpu_stat = cgroup_cpu_stat()
    limit = cpu_stat.with_name("cpu.max")
    print(f"gpu_clocks: cgroup CPU limit {limit.read_text().strip() if limit.exists() else 'none'}")
    with open(args.out, "w") as out:
        late_ms: float | None = None
        while time.time() < end:
            wall, read_start = time.time(), time.perf_counter()
            gpu = [
                nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                nvml.nvmlDeviceGetPowerUsage(handle),
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                reasons(handle),
                nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            ]
            read_ms = (time.perf_counter() - read_start) * 1e3
            sample = [wall, *gpu, *host_sample(cpu_stat=cpu_stat), late_ms, read_ms, cpu_probe_us()]
            out.write(json.dumps(sample) + "\n")
            asleep = time.perf_counter()
            time.sleep(args.every_ms / 1e3)
            late_ms = (time.perf_counter() - asleep) * 1e3 - args.every_ms
    return 0


if __name__ == "__main__":
    sys.exit(main())
