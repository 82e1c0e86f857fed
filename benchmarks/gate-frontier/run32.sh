#!/usr/bin/env bash
# Stream barriers every 0.2 ms of GPU work (GPREEMPT_GATE_BARRIER_MS) against none, on one
# machine: every GPU test, one trainer and three in 20 ms turns under light Case-A at load 0.5,
# and the first-kernel waits behind three trainers with barriers.
#   OUT=dir bash benchmarks/gate-frontier/run32.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 240 python3 -m pytest -q tests/gpu > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.txt"
mkdir -p /tmp/gf32
cell() {  # name, barrier ms, serve args, bench options...
  local name=$1 barrier=$2 serve=$3; shift 3
  GPREEMPT_GATE_BARRIER_MS=$barrier timeout 140 python3 -m gpreempt bench --no-nvml \
    --warmup-s 1 "$@" --serve-args="$serve" --out "/tmp/gf32/$name" \
    --scenarios gpreempt-gate > "/tmp/gf32/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1-barriers 0.2 "--turn-ms 20" --bg 1 --requests 2000
cell bg1-plain 0 "--turn-ms 20" --bg 1 --requests 2000
cell bg3-barriers 0.2 "--turn-ms 20" --bg 3 --requests 2000
GPREEMPT_GATE_BARRIER_MS=0.2 timeout 130 python3 benchmarks/gate-frontier/first_kernel.py \
  --trials 200 --prep-ms 0,1 --trainers 0,3 --serve-args="--turn-ms 20" \
  --out "$OUT/first_kernel_barriers.json" > "$OUT/first_kernel_barriers.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_barriers.json"
tar czf "$OUT/gf32.tgz" -C /tmp --exclude='*.png' gf32
tail -7 "$OUT/first_kernel_barriers.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf32
