"""Whether CUDA's checkpoint lock (``cuCheckpointProcessLock``) takes a PyTorch process that
loaded the driver-level gate (``CUDA_INJECTION64_PATH``): with no gate (``none``), with the gate
subscribed to CUPTI (``subscribed``), and after the gate let go of CUPTI (``released``). Each
child runs a loop of small matmuls; the parent locks and unlocks it and prints the outcome.

    PYTHONPATH=src python3 benchmarks/driver_gate/lock_with_gate.py
"""

import os
import subprocess
import sys
import time

from gpreempt.client.gate import driver_build
from gpreempt.mechanisms.cuda_driver import CheckpointDriver

lib = str(driver_build.build())
CHILD = r"""
import ctypes, os, sys, time, torch
mode = sys.argv[1]
x = torch.randn(256, 256, device="cuda")
if mode != "none":
    g = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
    g.gpreempt_driver_release.restype = ctypes.c_uint32
    if mode == "released":
        print("release ->", g.gpreempt_driver_release(), flush=True)
print("READY", flush=True)
t = time.time()
while time.time() - t < 20:
    x = torch.tanh(x @ x); torch.cuda.synchronize()
"""
drv = CheckpointDriver()
for mode in ("none", "subscribed", "released"):
    env = {**os.environ}
    if mode != "none":
        env["CUDA_INJECTION64_PATH"] = lib
    else:
        env.pop("CUDA_INJECTION64_PATH", None)
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, text=True
    )
    for line in p.stdout:
        print(mode, line.strip())
        if "READY" in line:
            break
    time.sleep(0.3)
    try:
        t = time.perf_counter()
        drv.lock(p.pid, 5000)
        ms = (time.perf_counter() - t) * 1e3
        print(mode, f"lock ok {ms:.1f} ms, state {drv.state(p.pid)!r}")
        drv.unlock(p.pid)
        print(mode, "unlock ok")
    except Exception as exc:
        print(mode, "lock failed:", exc)
    p.kill()
    p.wait()
