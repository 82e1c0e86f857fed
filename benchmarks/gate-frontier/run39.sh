#!/usr/bin/env bash
# Three trainers under light Case-A at load 0.5, same machine: barriers every 0.05 and 0.2 ms
# with the trainers side by side (--turn-ms 0), against the default (20 ms turns, no barriers).
#   OUT=dir bash benchmarks/gate-frontier/run39.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf39
cell() {  # name, barrier ms, serve args
  GPREEMPT_GATE_BARRIER_MS=$2 timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 \
    --bg 3 --requests 2000 --serve-args="$3" --out "/tmp/gf39/$1" --scenarios gpreempt-gate \
    > "/tmp/gf39/$1.log" 2>&1
  echo "$1 rc=$?"
}
cell bg3-side-barriers-005 0.05 "--turn-ms 0"
cell bg3-turns-plain 0 "--turn-ms 20"
cell bg3-side-barriers-02 0.2 "--turn-ms 0"
tar czf "$OUT/gf39.tgz" -C /tmp --exclude='*.png' gf39
python3 benchmarks/gate-frontier/table.py /tmp/gf39
