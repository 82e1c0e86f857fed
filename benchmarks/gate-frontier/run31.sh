#!/usr/bin/env bash
# With gates that go on by themselves: heavy Case-A with one trainer, one trainer under light
# Case-A at in-flight budgets of 1.5 and 2.0 ms (the frontier past the default 1.0), and the
# first-kernel waits behind none and three trainers in 20 ms turns.
#   OUT=dir bash benchmarks/gate-frontier/run31.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf31
cell() {  # name, serve args, bench options...
  local name=$1 serve=$2; shift 2
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="$serve" \
    --out "/tmp/gf31/$name" --scenarios gpreempt-gate > "/tmp/gf31/$name.log" 2>&1
  echo "$name rc=$?"
}
cell heavy-bg1 "--turn-ms 20" --case-a heavy --bg 1 --requests 1000
cell bg1-b15 "--turn-ms 20 --inflight-budget-ms 1.5" --bg 1 --requests 2000
cell bg1-b20 "--turn-ms 20 --inflight-budget-ms 2.0" --bg 1 --requests 2000
timeout 130 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --trainers 0,3 --serve-args="--turn-ms 20" --out "$OUT/first_kernel_turns.json" \
  > "$OUT/first_kernel_turns.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_turns.json"
tar czf "$OUT/gf31.tgz" -C /tmp --exclude='*.png' gf31
tail -7 "$OUT/first_kernel_turns.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf31
