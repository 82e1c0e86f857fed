#!/usr/bin/env bash
# First-kernel waits on the GPU's clock put on the host's (first_kernel.py's "queued": from the
# moment the launch calls returned to the kernel's start), behind 0, 1 and 3 trainers, 400
# trials: with the default barriers (every 0.1 ms), then with barriers off.
#   OUT=dir bash benchmarks/gate-frontier/run60.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
for setting in default no-barriers; do
  if [ $setting = no-barriers ]; then export GPREEMPT_GATE_BARRIER_MS=0; fi
  timeout 250 python3 benchmarks/gate-frontier/first_kernel.py --trials 400 --prep-ms 0,1 \
    --trainers 0,1,3 --out "$OUT/first_kernel_$setting.json" > "$OUT/first_kernel_$setting.log" 2>&1
  echo "first_kernel $setting rc=$?"
  gzip -f "$OUT/first_kernel_$setting.json"
  tail -11 "$OUT/first_kernel_$setting.log"
done
