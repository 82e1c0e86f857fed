"""A Python trainer that imports PyTorch and does its GPU work with CuPy or JAX, as people
write them (PyTorch for its DataLoader, say). It writes its GPU progress to a file every 20 ms.
The ``-devices`` kinds drive every visible GPU from the one process, in turn.

    python mixed_worker.py PROGRESS_FILE cupy|jax|torch-compile|cupy-devices|jax-devices SECONDS
"""

import os
import sys
import threading
import time

import torch

path, framework, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
count = 0


def report() -> None:
    tmp = path + ".tmp"
    while True:
        with open(tmp, "w") as f:
            f.write(str(read()))
        os.replace(tmp, path)
        time.sleep(0.02)


if framework in ("cupy", "cupy-devices"):
    import ctypes

    import cupy as cp

    torch.zeros(1, device="cuda")  # PyTorch has CUDA too
    devices = range(cp.cuda.runtime.getDeviceCount() if framework == "cupy-devices" else 1)
    # cudaHostAllocPortable | cudaHostAllocMapped: read without a CUDA call, one counter per
    # GPU, each valid on every GPU (unified addressing: the host address is the device's)
    host = cp.cuda.runtime.hostAlloc(8 * len(devices), 3)
    ctypes.memset(host, 0, 8 * len(devices))
    bump = cp.RawKernel(
        r"""extern "C" __global__ void bump(unsigned long long* c, long long spin) {
            long long t = clock64(); while (clock64() - t < spin) {}
            if (threadIdx.x == 0) atomicAdd(c, 1ULL); }""",
        "bump",
    )

    def read() -> int:
        return sum(ctypes.c_uint64.from_address(host + 8 * d).value for d in devices)

    def step() -> None:
        for _ in range(64):
            for d in devices:
                with cp.cuda.Device(d):
                    bump((1,), (32,), (cp.uint64(host + 8 * d), cp.int64(50000)))
        for d in devices:
            with cp.cuda.Device(d):
                cp.cuda.get_current_stream().synchronize()

elif framework in ("jax", "jax-devices"):
    import jax
    import jax.numpy as jnp

    devices = jax.devices() if framework == "jax-devices" else jax.devices()[:1]
    xs = [jax.device_put(jnp.ones((1024, 1024), jnp.float32), d) for d in devices]

    @jax.jit
    def update(x):
        for _ in range(8):
            x = jnp.tanh(x @ x * 1e-3)
        return x

    counts = [0] * len(devices)

    def read() -> int:
        return sum(counts)

    def steps_on(d: int, end: float) -> None:
        while time.monotonic() < end:
            xs[d] = update(xs[d])
            xs[d].block_until_ready()
            counts[d] += 1

    def step() -> None:
        """Steps on every GPU, each from a thread of its own (a GPU whose work goes on while
        another's is held counts on), for a second."""
        threads = [
            threading.Thread(target=steps_on, args=(d, time.monotonic() + 1.0))
            for d in range(len(devices))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

elif framework == "torch-compile":
    layer = torch.nn.Linear(1024, 1024).cuda()
    f = torch.compile(lambda t: torch.tanh(layer(t)) * 0.5 + t)
    x = torch.randn(256, 1024, device="cuda")

    def read() -> int:
        return count

    def step() -> None:
        global x, count
        with torch.no_grad():
            for _ in range(8):
                x = f(x)
        torch.cuda.synchronize()
        count += 1

else:
    raise SystemExit(f"unknown framework {framework}")

step()  # compile, warm up
threading.Thread(target=report, daemon=True).start()
end = time.monotonic() + seconds
while time.monotonic() < end:
    step()
print(read())
