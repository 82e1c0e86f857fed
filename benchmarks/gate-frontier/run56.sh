#!/usr/bin/env bash
# Barriers every 0.1 ms by default, same machine as run55: the GPU tests, the one-trainer cells
# under light and heavy Case-A with nothing set, and first-kernel waits behind 0, 1 and 3
# trainers again with 400 trials.
#   OUT=dir bash benchmarks/gate-frontier/run56.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf56
timeout 150 python3 -m pytest -q tests/gpu > /tmp/gf56/gpu_tests.txt 2>&1; tail -1 /tmp/gf56/gpu_tests.txt
cell() {  # name, bench options...
  local name=$1; shift
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf56/$name" \
    --scenarios gpreempt-gate > "/tmp/gf56/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1 --bg 1 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 400 --prep-ms 0,1 \
  --trainers 0,1,3 --out /tmp/gf56/first_kernel_defaults.json > /tmp/gf56/first_kernel_defaults.log 2>&1
echo "first_kernel rc=$?"
tar czf "$OUT/gf56.tgz" -C /tmp --exclude='*.png' gf56
tail -10 /tmp/gf56/first_kernel_defaults.log
python3 benchmarks/gate-frontier/table.py /tmp/gf56
python3 benchmarks/gate-frontier/window_states.py /tmp/gf56/bg1 /tmp/gf56/heavy-bg1 2>&1 | tail -2
