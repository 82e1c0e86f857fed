#!/usr/bin/env bash
# The gate with every process under MPS (trainers below normal client priority), against the
# gate alone: first-kernel waits and the three-trainer ResNet cell.
#   OUT=dir bash benchmarks/gate-frontier/run22.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf22
timeout 150 python3 benchmarks/gate-frontier/first_kernel.py --mps --trials 200 --prep-ms 0,1 \
  --out "$OUT/first_kernel_mps.json" > "$OUT/first_kernel_mps.log" 2>&1
echo "first_kernel --mps rc=$?"
timeout 150 python3 -m gpreempt bench --no-nvml --warmup-s 1 --bg 3 --requests 2000 \
  --out /tmp/gf22/bg3 --scenarios gpreempt-gate,gpreempt-gate-mps > /tmp/gf22/bg3.log 2>&1
echo "bg3 rc=$?"
gzip -f "$OUT/first_kernel_mps.json"
tar czf "$OUT/gf22.tgz" -C /tmp --exclude='*.png' gf22
tail -10 "$OUT/first_kernel_mps.log"
tail -12 /tmp/gf22/bg3.log
