#!/usr/bin/env bash
# An out-of-memory error and a CUDA graph in one process; the memory scenarios again with
# an eager Case-A.   OUT=dir bash benchmarks/gate-frontier/run6.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
for v in oom-eager; do
  timeout 100 python3 benchmarks/gate-frontier/repro_growth.py $v 2>&1 | grep "^$v" | tee -a "$OUT/repro.txt"
done
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf6
timeout 300 python3 -m gpreempt bench --quick --no-nvml \
  --scenarios memory-pressure,memory-pressure-baseline \
  --out /tmp/gf6/memory > /tmp/gf6/memory.log 2>&1
echo "memory rc=$?"
find /tmp/gf6 -name events.jsonl -exec gzip -9 {} +
tar czf "$OUT/gf6.tgz" -C /tmp --exclude='*.png' gf6
tail -22 /tmp/gf6/memory.log | grep -v "step/s"
