#!/usr/bin/env bash
# Requests that linger 0.05 ms, barriers every 0.025 ms, trainers side by side, load 0.5: three
# trainers under light Case-A, one and three under heavy Case-A.
#   OUT=dir bash benchmarks/gate-frontier/run43.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf43
cell() {  # name, linger ms, bench options...
  local name=$1 linger=$2; shift 2
  GPREEMPT_REQUEST_LINGER_MS=$linger GPREEMPT_GATE_BARRIER_MS=0.025 timeout 140 \
    python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="--turn-ms 0" \
    --out "/tmp/gf43/$name" --scenarios gpreempt-gate > "/tmp/gf43/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-side-barriers-linger005 0.05 --bg 3 --requests 2000
cell heavy-bg1-barriers-linger005 0.05 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3-side-barriers-linger005 0.05 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf43.tgz" -C /tmp --exclude='*.png' gf43
python3 benchmarks/gate-frontier/table.py /tmp/gf43
