#!/usr/bin/env bash
# After the barrier fixes (a context borrowed on threads new to CUDA; an incomplete watch list
# waits for the daemon on the GPU too): the GPU tests, then requests that linger 0.05 ms,
# barriers every 0.025 ms, trainers side by side, load 0.5.
#   OUT=dir bash benchmarks/gate-frontier/run44.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf44
cell() {  # name, linger ms, bench options...
  local name=$1 linger=$2; shift 2
  GPREEMPT_REQUEST_LINGER_MS=$linger GPREEMPT_GATE_BARRIER_MS=0.025 timeout 140 \
    python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="--turn-ms 0" \
    --out "/tmp/gf44/$name" --scenarios gpreempt-gate > "/tmp/gf44/$name.log" 2>&1
  echo "$name rc=$?"
}
python3 -m pytest -q tests/gpu > /tmp/gf44/gpu_tests.txt 2>&1; tail -1 /tmp/gf44/gpu_tests.txt
cell bg3-side-barriers-linger005 0.05 --bg 3 --requests 2000
cell bg1-barriers-linger005 0.05 --bg 1 --requests 2000
cell heavy-bg3-side-barriers-linger005 0.05 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf44.tgz" -C /tmp --exclude='*.png' gf44
python3 benchmarks/gate-frontier/table.py /tmp/gf44
