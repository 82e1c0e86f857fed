#!/usr/bin/env bash
# Barriers every 0.1 ms by default: the three-trainer cells (20 ms turns) under light and heavy
# Case-A with nothing set, first-kernel waits behind 0, 1 and 3 trainers, and the gate's
# overhead with no Case-A (benchmarks/gate/measure_gate.py).
#   OUT=dir bash benchmarks/gate-frontier/run55.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf55
cell() {  # name, bench options...
  local name=$1; shift
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf55/$name" \
    --scenarios gpreempt-gate > "/tmp/gf55/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3 --bg 3 --requests 2000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --trainers 0,1,3 --out /tmp/gf55/first_kernel_defaults.json > /tmp/gf55/first_kernel_defaults.log 2>&1
echo "first_kernel rc=$?"
mkdir -p /tmp/gf55/gate
timeout 200 python3 benchmarks/gate/measure_gate.py --out /tmp/gf55/gate --rounds 3 --steps 30 \
  > /tmp/gf55/gate/measure.txt 2>&1
echo "measure rc=$?"
tar czf "$OUT/gf55.tgz" -C /tmp --exclude='*.png' gf55
tail -10 /tmp/gf55/first_kernel_defaults.log
grep -v Warning /tmp/gf55/gate/measure.txt | tail -22
python3 benchmarks/gate-frontier/table.py /tmp/gf55
python3 benchmarks/gate-frontier/window_states.py /tmp/gf55/bg3 /tmp/gf55/heavy-bg3 2>&1 | tail -2
