#!/usr/bin/env bash
# What a smaller in-flight budget costs three trainers: budgets 0.75 (the default) and 0.4 ms,
# side by side.   OUT=dir bash benchmarks/gate-frontier/run13.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf13
for budget in 0.75 0.4; do
  timeout 170 python3 -m gpreempt bench --no-nvml --warmup-s 1 --bg 3 --requests 2000 \
    --serve-args "--inflight-budget-ms $budget" --out "/tmp/gf13/bg3-b$budget" \
    --scenarios gpreempt-gate > "/tmp/gf13/bg3-b$budget.log" 2>&1
  echo "bg3-b$budget rc=$?"
done
tar czf "$OUT/gf13.tgz" -C /tmp --exclude='*.png' gf13
python3 benchmarks/gate-frontier/table.py /tmp/gf13
