#!/usr/bin/env bash
# After the protocol fix (a watch push's descriptors no longer go to the reply read with it):
# first-kernel waits behind trainers in 20 ms turns with barriers every 0.025 ms; the light
# cells with the defaults (turns, no barriers); three trainers in turns with barriers.
#   OUT=dir bash benchmarks/gate-frontier/run48.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf48
GPREEMPT_GATE_BARRIER_MS=0.025 timeout 200 python3 benchmarks/gate-frontier/first_kernel.py \
  --trials 200 --prep-ms 0,1 --trainers 0,1,3 --serve-args="--turn-ms 20" \
  --out /tmp/gf48/first_kernel_barriers_turns.json > /tmp/gf48/first_kernel_barriers_turns.log 2>&1
echo "first_kernel rc=$?"
cell() {  # name, barrier ms, bench options...
  local name=$1 barrier=$2; shift 2
  GPREEMPT_GATE_BARRIER_MS=$barrier timeout 140 python3 -m gpreempt bench --no-nvml \
    --warmup-s 1 "$@" --out "/tmp/gf48/$name" --scenarios gpreempt-gate \
    > "/tmp/gf48/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1-default 0 --bg 1 --requests 2000
cell bg3-turns-default 0 --bg 3 --requests 2000
cell bg3-turns-barriers-0025 0.025 --bg 3 --requests 2000
gzip -f /tmp/gf48/first_kernel_barriers_turns.json
tar czf "$OUT/gf48.tgz" -C /tmp --exclude='*.png' gf48
tail -10 /tmp/gf48/first_kernel_barriers_turns.log
python3 benchmarks/gate-frontier/table.py /tmp/gf48
