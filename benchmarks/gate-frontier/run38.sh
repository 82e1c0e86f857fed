#!/usr/bin/env bash
# Is it the turns? First-kernel waits behind three trainers with barriers every 0.2 ms, side by
# side (--turn-ms 0), against run33's 20 ms turns.
#   OUT=dir bash benchmarks/gate-frontier/run38.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
GPREEMPT_GATE_BARRIER_MS=0.2 timeout 150 python3 benchmarks/gate-frontier/first_kernel.py \
  --trials 200 --prep-ms 0,1 --trainers 0,3 --serve-args="--turn-ms 0" \
  --out "$OUT/first_kernel_barriers_side.json" > "$OUT/first_kernel_barriers_side.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_barriers_side.json"
tail -7 "$OUT/first_kernel_barriers_side.log"
