#!/usr/bin/env bash
# run57 again with first_kernel.py calibrating its GPU clock after the trials (before them, its
# request() calls had made the no-hint prober stop counting as active by its launches); barriers
# every 0.1 ms by default: first-kernel waits behind 0, 1 and 3
# trainers timed on the GPU's clock as well (first_kernel.py's start waits, 400 trials), then
# the four target cells with nothing set.
#   OUT=dir bash benchmarks/gate-frontier/run58.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf58
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 400 --prep-ms 0,1 \
  --trainers 0,1,3 --out /tmp/gf58/first_kernel_defaults.json > /tmp/gf58/first_kernel_defaults.log 2>&1
echo "first_kernel rc=$?"
tail -10 /tmp/gf58/first_kernel_defaults.log
cell() {  # name, bench options...
  local name=$1; shift
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf58/$name" \
    --scenarios gpreempt-gate > "/tmp/gf58/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1 --bg 1 --requests 2000
cell bg3 --bg 3 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf58.tgz" -C /tmp --exclude='*.png' gf58
python3 benchmarks/gate-frontier/table.py /tmp/gf58
python3 benchmarks/gate-frontier/window_states.py /tmp/gf58/bg1 /tmp/gf58/bg3 /tmp/gf58/heavy-bg1 \
  /tmp/gf58/heavy-bg3 2>&1 | tail -4
