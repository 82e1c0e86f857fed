#!/usr/bin/env bash
# With the 1 ms sleep at a closed gate: heavy Case-A with three trainers in 20 ms turns, one
# trainer (no peers: turns do not apply), first-kernel waits behind three in turns.
#   OUT=dir bash benchmarks/gate-frontier/run29.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf29
cell() {  # name, serve args, bench options...
  local name=$1 serve=$2; shift 2
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="$serve" \
    --out "/tmp/gf29/$name" --scenarios gpreempt-gate > "/tmp/gf29/$name.log" 2>&1
  echo "$name rc=$?"
}
cell heavy-bg3-turns "--turn-ms 20" --case-a heavy --bg 3 --requests 1000
cell bg1 "--turn-ms 20" --bg 1 --requests 2000
timeout 100 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --trainers 0,3 --serve-args="--turn-ms 20" --out "$OUT/first_kernel_turns.json" \
  > "$OUT/first_kernel_turns.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_turns.json"
tar czf "$OUT/gf29.tgz" -C /tmp --exclude='*.png' gf29
tail -7 "$OUT/first_kernel_turns.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf29
