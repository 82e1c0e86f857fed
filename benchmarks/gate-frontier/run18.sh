#!/usr/bin/env bash
# Per-operator costs in the bench's light cells: three trainers with and without them (same
# machine), one trainer with them.   OUT=dir bash benchmarks/gate-frontier/run18.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf18
cell() {  # name, GPREEMPT_GATE_OP_COSTS, bench options...
  local name=$1 costs=$2; shift 2
  GPREEMPT_GATE_OP_COSTS=$costs timeout 175 python3 -m gpreempt bench --no-nvml --warmup-s 1 \
    "$@" --out "/tmp/gf18/$name" --scenarios gpreempt-gate > "/tmp/gf18/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-costs 1 --bg 3 --requests 2000
cell bg3-average 0 --bg 3 --requests 2000
cell bg1-costs 1 --bg 1 --requests 2000
tar czf "$OUT/gf18.tgz" -C /tmp --exclude='*.png' gf18
python3 benchmarks/gate-frontier/table.py /tmp/gf18
