#!/usr/bin/env bash
# Gate checks after the estimator change, the lock on a CuPy loop under `gpreempt run`,
# first-kernel waits, and three trainers with 2000 requests.
#   OUT=dir bash benchmarks/gate-frontier/run1.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 150 python3 -m pytest tests/gpu/test_gate_gpu.py -q -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu gate tests rc=$?"; tail -2 "$OUT/pytest_gpu.txt"
timeout 120 python3 benchmarks/validate/validate_gpu.py all --sections lock_run_cupy \
  --out /tmp/val > "$OUT/validate_cupy_run.log" 2>&1
echo "validate rc=$?"; cp /tmp/val/validate.json "$OUT/validate_cupy_run.json"; tail -4 "$OUT/validate_cupy_run.log"
timeout 240 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --out "$OUT/first_kernel.json" > "$OUT/first_kernel.log" 2>&1
echo "first_kernel rc=$?"; tail -10 "$OUT/first_kernel.log"
mkdir -p /tmp/gf
timeout 200 python3 -m gpreempt bench --no-nvml --bg 3 --requests 2000 --warmup-s 1 \
  --out /tmp/gf/bg3-2000 --scenarios gpreempt-gate > /tmp/gf/bg3-2000.log 2>&1
echo "bench rc=$?"
python3 benchmarks/gate-frontier/outliers.py /tmp/gf/bg3-2000 > /tmp/gf/bg3-2000/outliers.json
tar czf "$OUT/gf.tgz" -C /tmp --exclude='*.png' gf
grep -A4 "P99 ratio |" /tmp/gf/bg3-2000/report.md; grep -A5 "B kept |" /tmp/gf/bg3-2000/report.md
