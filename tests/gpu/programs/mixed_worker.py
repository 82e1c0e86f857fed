"""A Python trainer that imports PyTorch and does its GPU work with CuPy or JAX, as people
write them (PyTorch for its DataLoader, say). It writes its GPU progress to a file every 20 ms.

    python mixed_worker.py PROGRESS_FILE cupy|jax|torch-compile SECONDS
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


if framework == "cupy":
    import ctypes

    import cupy as cp

    torch.zeros(1, device="cuda")  # PyTorch has CUDA too
    host = cp.cuda.runtime.hostAlloc(8, 2)  # cudaHostAllocMapped: read without a CUDA call
    ctypes.c_uint64.from_address(host).value = 0
    device = host  # unified addressing: the mapped host address is valid on the GPU
    bump = cp.RawKernel(
        r"""extern "C" __global__ void bump(unsigned long long* c, long long spin) {
            long long t = clock64(); while (clock64() - t < spin) {}
            if (threadIdx.x == 0) atomicAdd(c, 1ULL); }""",
        "bump",
    )

    def read() -> int:
        return ctypes.c_uint64.from_address(host).value

    def step() -> None:
        for _ in range(64):
            bump((1,), (32,), (cp.uint64(device), cp.int64(50000)))
        cp.cuda.get_current_stream().synchronize()

elif framework == "jax":
    import jax
    import jax.numpy as jnp

    x = jnp.ones((1024, 1024), jnp.float32)

    @jax.jit
    def update(x):
        for _ in range(8):
            x = jnp.tanh(x @ x * 1e-3)
        return x

    def read() -> int:
        return count

    def step() -> None:
        global x, count
        x = update(x)
        x.block_until_ready()
        count += 1

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
