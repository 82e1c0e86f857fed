#!/usr/bin/env bash
# After gate preemptions stopped rewriting the daemon's state file: first-kernel waits again,
# and the gate's overhead and drain on the current code.
#   OUT=dir bash benchmarks/gate-frontier/run4.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --out "$OUT/first_kernel.json" > "$OUT/first_kernel.log" 2>&1
echo "first_kernel rc=$?"
timeout 260 python3 benchmarks/gate/measure_gate.py --out "$OUT" --rounds 1 --steps 10 \
  --heavy-rounds 3 --heavy-steps 10 --closures 40 --blocks 4 > "$OUT/measure.txt" 2>&1
echo "measure_gate rc=$?"
tail -10 "$OUT/first_kernel.log"; grep -v Warning "$OUT/measure.txt" | tail -22
