#!/usr/bin/env bash
# Stream barriers: every GPU test; one trainer under light Case-A with barriers every 0.05 ms
# (against 0.2 ms in run32: is Case-A's cost the drain to the next barrier?); first-kernel
# waits behind none, one and three trainers with barriers every 0.2 ms.
#   OUT=dir bash benchmarks/gate-frontier/run33.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 120 python3 -m pytest -q tests/gpu > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.txt"
mkdir -p /tmp/gf33
GPREEMPT_GATE_BARRIER_MS=0.05 timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 \
  --bg 1 --requests 2000 --serve-args="--turn-ms 20" --out /tmp/gf33/bg1-barriers-005 \
  --scenarios gpreempt-gate > /tmp/gf33/bg1-barriers-005.log 2>&1
echo "bg1-barriers-005 rc=$?"
GPREEMPT_GATE_BARRIER_MS=0.2 timeout 200 python3 benchmarks/gate-frontier/first_kernel.py \
  --trials 200 --prep-ms 0,1 --trainers 0,1,3 --serve-args="--turn-ms 20" \
  --out "$OUT/first_kernel_barriers.json" > "$OUT/first_kernel_barriers.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_barriers.json"
tar czf "$OUT/gf33.tgz" -C /tmp --exclude='*.png' gf33
tail -10 "$OUT/first_kernel_barriers.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf33
