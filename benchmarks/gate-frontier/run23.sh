#!/usr/bin/env bash
# The gate under MPS with smaller in-flight budgets: three trainers at 0.25 and 0.5 ms, one
# trainer at 0.5 ms.   OUT=dir bash benchmarks/gate-frontier/run23.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf23
cell() {  # name, budget, bench options...
  local name=$1 budget=$2; shift 2
  timeout 170 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" \
    --serve-args="--inflight-budget-ms $budget" \
    --out "/tmp/gf23/$name" --scenarios gpreempt-gate-mps > "/tmp/gf23/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-0.25 0.25 --bg 3 --requests 2000
cell bg3-0.5 0.5 --bg 3 --requests 2000
cell bg1-0.5 0.5 --bg 1 --requests 2000
tar czf "$OUT/gf23.tgz" -C /tmp --exclude='*.png' --exclude=mps gf23
python3 benchmarks/gate-frontier/table.py /tmp/gf23
