#!/usr/bin/env bash
# A closed gate sleeps 1 ms between looks (the daemon wakes it) and ends a timed operator before
# it waits: every GPU test, then three trainers in 20 ms turns and side by side, load 0.5.
#   OUT=dir bash benchmarks/gate-frontier/run28.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 240 python3 -m pytest -q tests/gpu > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.txt"
mkdir -p /tmp/gf28
cell() {  # name, serve args, bench options...
  local name=$1 serve=$2; shift 2
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="$serve" \
    --out "/tmp/gf28/$name" --scenarios gpreempt-gate > "/tmp/gf28/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-turns "--turn-ms 20" --bg 3 --requests 2000
cell bg3-side "--turn-ms 0" --bg 3 --requests 2000
tar czf "$OUT/gf28.tgz" -C /tmp --exclude='*.png' gf28
python3 benchmarks/gate-frontier/table.py /tmp/gf28
