#!/usr/bin/env bash
# Per-operator costs in the gate: where Case-B's step spends GPU time, the GPU gate tests, the
# A/B in one process (throughput, work left queued after each step), first-kernel waits.
#   OUT=dir bash benchmarks/gate-frontier/run16.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
python3 benchmarks/gate-frontier/op_costs.py --out "$OUT/op_costs.json" 2>&1 | grep -v -i warn | tail -22
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gate_gpu.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.txt"
timeout 150 python3 benchmarks/gate-frontier/op_cost_ab.py --out "$OUT/op_cost_ab.json" \
  > "$OUT/op_cost_ab.log" 2>&1
echo "op_cost_ab rc=$?"
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --out "$OUT/first_kernel.json" > "$OUT/first_kernel.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel.json"
tail -6 "$OUT/op_cost_ab.log"; tail -10 "$OUT/first_kernel.log"
