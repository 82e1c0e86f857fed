#!/usr/bin/env bash
# Stream barriers every 0.05 ms against none, on one machine: one trainer, and three in 20 ms
# turns, under light Case-A at load 0.5, alternating.
#   OUT=dir bash benchmarks/gate-frontier/run34.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf34
cell() {  # name, barrier ms, bench options...
  local name=$1 barrier=$2; shift 2
  GPREEMPT_GATE_BARRIER_MS=$barrier timeout 140 python3 -m gpreempt bench --no-nvml \
    --warmup-s 1 "$@" --serve-args="--turn-ms 20" --out "/tmp/gf34/$name" \
    --scenarios gpreempt-gate > "/tmp/gf34/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1-barriers 0.05 --bg 1 --requests 2000
cell bg1-plain 0 --bg 1 --requests 2000
cell bg3-barriers 0.05 --bg 3 --requests 2000
cell bg3-plain 0 --bg 3 --requests 2000
tar czf "$OUT/gf34.tgz" -C /tmp --exclude='*.png' gf34
python3 benchmarks/gate-frontier/table.py /tmp/gf34
