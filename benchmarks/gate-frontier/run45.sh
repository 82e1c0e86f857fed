#!/usr/bin/env bash
# The GPU tests with the gate's own block kept mapped; the light cells again (requests that
# linger 0.05 ms, barriers every 0.025 ms, side by side), and one trainer without barriers with
# the linger, load 0.5.
#   OUT=dir bash benchmarks/gate-frontier/run45.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf45
cell() {  # name, linger ms, bench options...
  local name=$1 linger=$2; shift 2
  GPREEMPT_REQUEST_LINGER_MS=$linger GPREEMPT_GATE_BARRIER_MS=0.025 timeout 140 \
    python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="--turn-ms 0" \
    --out "/tmp/gf45/$name" --scenarios gpreempt-gate > "/tmp/gf45/$name.log" 2>&1
  echo "$name rc=$?"
}
python3 -m pytest -q tests/gpu > /tmp/gf45/gpu_tests.txt 2>&1; tail -1 /tmp/gf45/gpu_tests.txt
cell bg1-barriers-linger005 0.05 --bg 1 --requests 2000
cell bg3-side-barriers-linger005 0.05 --bg 3 --requests 2000
GPREEMPT_REQUEST_LINGER_MS=0.05 timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 \
  --bg 1 --requests 2000 --out /tmp/gf45/bg1-plain-linger005 --scenarios gpreempt-gate \
  > /tmp/gf45/bg1-plain-linger005.log 2>&1
echo "bg1-plain-linger005 rc=$?"
tar czf "$OUT/gf45.tgz" -C /tmp --exclude='*.png' gf45
python3 benchmarks/gate-frontier/table.py /tmp/gf45
