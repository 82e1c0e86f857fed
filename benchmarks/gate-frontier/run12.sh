#!/usr/bin/env bash
# The one-trainer cells, three repeats each, for their median and spread; the light one with
# NVML sampling on (GPU utilisation of Case-B alone and gated).
#   OUT=dir bash benchmarks/gate-frontier/run12.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf12
timeout 280 python3 -m gpreempt bench --warmup-s 1 --bg 1 --requests 2000 --repeats 3 \
  --out /tmp/gf12/bg1-r3 --scenarios gpreempt-gate > /tmp/gf12/bg1-r3.log 2>&1
echo "bg1-r3 rc=$?"
timeout 280 python3 -m gpreempt bench --no-nvml --warmup-s 1 --case-a heavy --bg 1 \
  --requests 1000 --repeats 3 --out /tmp/gf12/heavy-bg1-r3 --scenarios gpreempt-gate \
  > /tmp/gf12/heavy-bg1-r3.log 2>&1
echo "heavy-bg1-r3 rc=$?"
tar czf "$OUT/gf12.tgz" -C /tmp --exclude='*.png' gf12
for d in bg1-r3 heavy-bg1-r3; do
  sed -n '/Case-A latency/,/^## Preemption/p' /tmp/gf12/$d/report.md | grep -v '^$'
  sed -n '/GPU utilisation/,/^## Plots/p' /tmp/gf12/$d/report.md | grep '^|'
done
