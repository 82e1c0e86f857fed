"""Does an out-of-memory error break a CUDA graph replayed later in the same process?

    PYTHONPATH=src python3 benchmarks/gate-frontier/repro_growth.py fits|oom|oom-noempty|oom-eager

Builds the bench's graph-replayed ResNet-50 server, grows the working set (``fits``: 4 GiB
less than is free; ``oom``: 10 GiB more, so allocations fail and everything is released and
the cache emptied; ``oom-noempty``: the same without emptying the cache; ``oom-eager``: ``oom``
with an eagerly run server, no graph), then serves 5
requests and prints whether they worked.
"""

from __future__ import annotations

import sys

from gpreempt.bench.loops import grow_working_set
from gpreempt.bench.workloads import TorchMemory, resnet50_server

variant = sys.argv[1]
handle = resnet50_server(batch=8, graph=variant != "oom-eager")
handle()
print(variant, "first request ok", flush=True)
mem = TorchMemory()
free = mem.free_bytes()
total = free + (10 << 30) if variant.startswith("oom") else free - (4 << 30)
if variant == "oom-noempty":
    TorchMemory.release = lambda self, blocks: blocks.clear()
held, info = grow_working_set(mem, total, 1 << 30, 0.3)
print(variant, "growth oom", info["oom"], "errors", info["oom_errors"], flush=True)
try:
    for _ in range(5):
        handle()
    print(variant, "requests after growth OK", flush=True)
except Exception as e:
    print(variant, "requests after growth FAILED", type(e).__name__, str(e)[:80], flush=True)
