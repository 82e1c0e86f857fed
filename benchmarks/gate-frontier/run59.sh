#!/usr/bin/env bash
# Barriers every 0.1 ms by default, on a third machine: first-kernel waits behind 0, 1 and 3
# trainers, also timed on the GPU's clock from the launch (start) and from the moment the launch
# calls returned (queued), 400 trials; then the four target cells with nothing set.
#   OUT=dir bash benchmarks/gate-frontier/run59.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf59
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 400 --prep-ms 0,1 \
  --trainers 0,1,3 --out /tmp/gf59/first_kernel_defaults.json > /tmp/gf59/first_kernel_defaults.log 2>&1
echo "first_kernel rc=$?"
tail -10 /tmp/gf59/first_kernel_defaults.log
cell() {  # name, bench options...
  local name=$1; shift
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf59/$name" \
    --scenarios gpreempt-gate > "/tmp/gf59/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1 --bg 1 --requests 2000
cell bg3 --bg 3 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf59.tgz" -C /tmp --exclude='*.png' gf59
python3 benchmarks/gate-frontier/table.py /tmp/gf59
python3 benchmarks/gate-frontier/window_states.py /tmp/gf59/bg1 /tmp/gf59/bg3 /tmp/gf59/heavy-bg1 \
  /tmp/gf59/heavy-bg3 2>&1 | tail -4
