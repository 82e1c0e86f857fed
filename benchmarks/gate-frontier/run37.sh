#!/usr/bin/env bash
# Is it the depth of the queue held behind the barrier? The probe of run36 with three trainers
# whose CPUs run 4000 waits ahead (about 100 ms of matmuls) instead of 256.
#   OUT=dir bash benchmarks/gate-frontier/run37.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/gate-frontier/stream_wait_probe.py --seconds 2 --every 1 \
  --ahead 4000 --lead-ms 1 --server-kernels 1 --gap-ms 10 --trainers 3 \
  --out "$OUT/probe_small_lead1_trainers3_deep.json" 2>&1 | tail -7
gzip -f "$OUT/probe_small_lead1_trainers3_deep.json"
