#!/usr/bin/env bash
# Why does a request wait behind trainers held at a barrier in the bench but not in the probe?
# The probe with requests like first_kernel.py's (one small kernel after 10 ms of quiet, the
# word set 1 ms before it), behind one and three trainer processes.
#   OUT=dir bash benchmarks/gate-frontier/run36.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
for n in 1 3; do
  timeout 120 python3 benchmarks/gate-frontier/stream_wait_probe.py --seconds 2 --every 1 \
    --ahead 256 --lead-ms 1 --server-kernels 1 --gap-ms 10 --trainers $n \
    --out "$OUT/probe_small_lead1_trainers$n.json" 2>&1 | tail -7
  gzip -f "$OUT/probe_small_lead1_trainers$n.json"
done
