#!/usr/bin/env bash
# Peers take turns (the daemon's default, 20 ms turns) against side by side (--turn-ms 0):
# three trainers with ResNet and heavy Case-A, and first-kernel waits.
#   OUT=dir bash benchmarks/gate-frontier/run24.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf24
cell() {  # name, serve args, bench options...
  local name=$1 serve=$2; shift 2
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="$serve" \
    --out "/tmp/gf24/$name" --scenarios gpreempt-gate > "/tmp/gf24/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-turns "--turn-ms 20" --bg 3 --requests 2000
cell bg3-side "--turn-ms 0" --bg 3 --requests 2000
cell heavy-bg3-turns "--turn-ms 20" --case-a heavy --bg 3 --requests 1000
timeout 150 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --trainers 0,3 --out "$OUT/first_kernel.json" > "$OUT/first_kernel.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel.json"
tar czf "$OUT/gf24.tgz" -C /tmp --exclude='*.png' gf24
tail -7 "$OUT/first_kernel.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf24
