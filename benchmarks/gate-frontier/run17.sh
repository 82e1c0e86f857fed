#!/usr/bin/env bash
# Per-operator costs with upper bounds standing in for operators never timed exactly, and the
# time bound applying from the first timing: GPU gate tests, the A/B in one process, and
# first-kernel waits with and without per-operator costs on the same machine.
#   OUT=dir bash benchmarks/gate-frontier/run17.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gate_gpu.py > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.txt"
timeout 150 python3 benchmarks/gate-frontier/op_cost_ab.py --out "$OUT/op_cost_ab.json" \
  > "$OUT/op_cost_ab.log" 2>&1
echo "op_cost_ab rc=$?"
for costs in 1 0; do
  GPREEMPT_GATE_OP_COSTS=$costs timeout 200 python3 benchmarks/gate-frontier/first_kernel.py \
    --trials 200 --prep-ms 0,1 --out "$OUT/first_kernel_costs$costs.json" \
    > "$OUT/first_kernel_costs$costs.log" 2>&1
  echo "first_kernel costs=$costs rc=$?"
  gzip -f "$OUT/first_kernel_costs$costs.json"
done
tail -6 "$OUT/op_cost_ab.log"
for costs in 1 0; do echo "costs=$costs"; tail -7 "$OUT/first_kernel_costs$costs.log"; done
