#!/usr/bin/env bash
# First-kernel waits with three trainers, side by side (the default) and taking 20 ms turns,
# one after the other on the same machine.   OUT=dir bash benchmarks/gate-frontier/run26.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
for mode in side turns; do
  serve="--turn-ms 0"; [ "$mode" = turns ] && serve="--turn-ms 20"
  timeout 170 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
    --trainers 0,3 --serve-args="$serve" --out "$OUT/first_kernel_$mode.json" \
    > "$OUT/first_kernel_$mode.log" 2>&1
  echo "first_kernel $mode rc=$?"
  gzip -f "$OUT/first_kernel_$mode.json"
done
for mode in side turns; do echo "== $mode"; tail -7 "$OUT/first_kernel_$mode.log"; done
