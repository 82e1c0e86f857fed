#!/usr/bin/env bash
# Operator timings that end with the operator (not at the next one): the A/B in one process,
# three trainers at in-flight budgets 0.75 and 1.25 ms, first-kernel waits at both budgets.
#   OUT=dir bash benchmarks/gate-frontier/run19.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 150 python3 benchmarks/gate-frontier/op_cost_ab.py --out "$OUT/op_cost_ab.json" \
  > "$OUT/op_cost_ab.log" 2>&1
echo "op_cost_ab rc=$?"
mkdir -p /tmp/gf19
cell() {  # name, bench options...
  local name=$1; shift
  timeout 175 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" \
    --out "/tmp/gf19/$name" --scenarios gpreempt-gate > "/tmp/gf19/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-b0.75 --bg 3 --requests 2000
cell bg3-b1.25 --bg 3 --requests 2000 --serve-args=--inflight-budget-ms=1.25
timeout 220 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --budgets 0.75,1.25 --out "$OUT/first_kernel.json" > "$OUT/first_kernel.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel.json"
tar czf "$OUT/gf19.tgz" -C /tmp --exclude='*.png' gf19
tail -6 "$OUT/op_cost_ab.log"; tail -19 "$OUT/first_kernel.log" | grep -v " 0 "
python3 benchmarks/gate-frontier/table.py /tmp/gf19
