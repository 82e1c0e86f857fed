#!/usr/bin/env bash
# The opt-in bench scenarios on a GPU: the time-slice and share policies, the in-process
# scheduler, and memory pressure with and without gpreempt.
#   OUT=dir bash benchmarks/gate-frontier/run5.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf5
timeout 280 python3 -m gpreempt bench --quick --no-nvml \
  --scenarios gpreempt-timeslice,gpreempt-share,gpreempt-scheduler \
  --out /tmp/gf5/policies > /tmp/gf5/policies.log 2>&1
echo "policies rc=$?"
timeout 280 python3 -m gpreempt bench --quick --no-nvml \
  --scenarios memory-pressure,memory-pressure-baseline \
  --out /tmp/gf5/memory > /tmp/gf5/memory.log 2>&1
echo "memory rc=$?"
find /tmp/gf5 -name events.jsonl -exec gzip -9 {} +
tar czf "$OUT/gf5.tgz" -C /tmp --exclude='*.png' gf5
for r in policies memory; do tail -30 /tmp/gf5/$r.log | grep -v "it/s\|step/s"; done
