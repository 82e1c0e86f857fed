#!/usr/bin/env bash
# First-kernel waits behind one and three trainers with barriers every 0.025 ms side by side
# (--turn-ms 0), requests lingering 0.05 ms (the default), after the barrier fixes.
#   OUT=dir bash benchmarks/gate-frontier/run47.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
GPREEMPT_GATE_BARRIER_MS=0.025 timeout 200 python3 benchmarks/gate-frontier/first_kernel.py \
  --trials 200 --prep-ms 0,1 --trainers 0,1,3 --serve-args="--turn-ms 0" \
  --out "$OUT/first_kernel_barriers_side.json" > "$OUT/first_kernel_barriers_side.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_barriers_side.json"
tail -10 "$OUT/first_kernel_barriers_side.log"
