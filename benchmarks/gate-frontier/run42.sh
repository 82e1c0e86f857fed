#!/usr/bin/env bash
# Requests that linger: one trainer with barriers every 0.025 ms under light Case-A, load 0.5,
# the server's requests dropped at once and kept raised 0.05 ms after the last one ends; then
# the GPU tests.
#   OUT=dir bash benchmarks/gate-frontier/run42.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf42
cell() {  # name, linger ms, bench options...
  local name=$1 linger=$2; shift 2
  GPREEMPT_REQUEST_LINGER_MS=$linger GPREEMPT_GATE_BARRIER_MS=0.025 timeout 140 \
    python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="--turn-ms 0" \
    --out "/tmp/gf42/$name" --scenarios gpreempt-gate > "/tmp/gf42/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1-barriers-linger0 0 --bg 1 --requests 2000
cell bg1-barriers-linger005 0.05 --bg 1 --requests 2000
python3 -m pytest -q tests/gpu > /tmp/gf42/gpu_tests.txt 2>&1; tail -1 /tmp/gf42/gpu_tests.txt
tar czf "$OUT/gf42.tgz" -C /tmp --exclude='*.png' gf42
python3 benchmarks/gate-frontier/table.py /tmp/gf42
