#!/usr/bin/env bash
# Requests that warm the GPU (a no-op kernel as request() is entered, GPREEMPT_REQUEST_WARM):
# the GPU tests, then first-kernel waits on the GPU's clock behind 0, 1 and 3 trainers with the
# warm-up and without it, barriers every 0.1 ms.
#   OUT=dir bash benchmarks/gate-frontier/run61.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS GPREEMPT_REQUEST_WARM
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 150 python3 -m pytest -q tests/gpu > "$OUT/gpu_tests.txt" 2>&1; tail -1 "$OUT/gpu_tests.txt"
for setting in warm no-warm; do
  if [ $setting = warm ]; then export GPREEMPT_REQUEST_WARM=1; else export GPREEMPT_REQUEST_WARM=0; fi
  timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 300 --prep-ms 0,1 \
    --trainers 0,1,3 --out "$OUT/first_kernel_$setting.json" > "$OUT/first_kernel_$setting.log" 2>&1
  echo "first_kernel $setting rc=$?"
  gzip -f "$OUT/first_kernel_$setting.json"
  tail -11 "$OUT/first_kernel_$setting.log"
done
