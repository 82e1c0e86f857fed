#!/usr/bin/env bash
# Barriers every 0.025 ms: one trainer under light Case-A, three side by side under heavy
# Case-A, load 0.5.
#   OUT=dir bash benchmarks/gate-frontier/run41.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf41
cell() {  # name, bench options...
  local name=$1; shift
  GPREEMPT_GATE_BARRIER_MS=0.025 timeout 140 python3 -m gpreempt bench --no-nvml \
    --warmup-s 1 "$@" --serve-args="--turn-ms 0" --out "/tmp/gf41/$name" \
    --scenarios gpreempt-gate > "/tmp/gf41/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1-barriers-0025 --bg 1 --requests 2000
cell heavy-bg3-side-barriers-0025 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf41.tgz" -C /tmp --exclude='*.png' gf41
python3 benchmarks/gate-frontier/table.py /tmp/gf41
