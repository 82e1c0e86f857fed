#!/usr/bin/env bash
# Turns with the idle fix, at budgets 1.0 and 1.5 ms, three trainers, ResNet and heavy Case-A.
#   OUT=dir bash benchmarks/gate-frontier/run25.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf25
cell() {  # name, serve args, bench options...
  local name=$1 serve=$2; shift 2
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="$serve" \
    --out "/tmp/gf25/$name" --scenarios gpreempt-gate > "/tmp/gf25/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-1.0 "--inflight-budget-ms 1.0" --bg 3 --requests 2000
cell bg3-1.5 "--inflight-budget-ms 1.5" --bg 3 --requests 2000
cell heavy-bg3-1.0 "--inflight-budget-ms 1.0" --case-a heavy --bg 3 --requests 1000
cell heavy-bg3-1.5 "--inflight-budget-ms 1.5" --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf25.tgz" -C /tmp --exclude='*.png' gf25
python3 benchmarks/gate-frontier/table.py /tmp/gf25
