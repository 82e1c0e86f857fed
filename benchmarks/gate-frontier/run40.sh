#!/usr/bin/env bash
# Barriers every 0.025 ms with three trainers side by side, against the default (20 ms turns,
# no barriers), light Case-A at load 0.5, same machine.
#   OUT=dir bash benchmarks/gate-frontier/run40.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf40
cell() {  # name, barrier ms, serve args
  GPREEMPT_GATE_BARRIER_MS=$2 timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 \
    --bg 3 --requests 2000 --serve-args="$3" --out "/tmp/gf40/$1" --scenarios gpreempt-gate \
    > "/tmp/gf40/$1.log" 2>&1
  echo "$1 rc=$?"
}
cell bg3-side-barriers-0025 0.025 "--turn-ms 0"
cell bg3-turns-plain 0 "--turn-ms 20"
tar czf "$OUT/gf40.tgz" -C /tmp --exclude='*.png' gf40
python3 benchmarks/gate-frontier/table.py /tmp/gf40
