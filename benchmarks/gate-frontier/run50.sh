#!/usr/bin/env bash
# The defaults as they are now: first-kernel waits behind 0, 1 and 3 trainers (20 ms turns,
# barriers), then the gate's overhead with no Case-A (benchmarks/gate/run_on_gpu.sh, which
# also runs the CPU and GPU gate tests).
#   OUT=dir bash benchmarks/gate-frontier/run50.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --trainers 0,1,3 --out "$OUT/first_kernel_defaults.json" > "$OUT/first_kernel_defaults.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_defaults.json"
tail -10 "$OUT/first_kernel_defaults.log"
mkdir -p "$OUT/gate"
OUT="$OUT/gate" bash benchmarks/gate/run_on_gpu.sh 2>&1 | tail -40
