#!/usr/bin/env bash
# Gates go on by themselves when the request they stopped for ends: every GPU test, then one
# and three trainers (20 ms turns) under light Case-A at load 0.5, with and without
# --no-watch-resume, alternating.
#   OUT=dir bash benchmarks/gate-frontier/run30.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 240 python3 -m pytest -q tests/gpu > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.txt"
mkdir -p /tmp/gf30
cell() {  # name, serve args, bench options...
  local name=$1 serve=$2; shift 2
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="$serve" \
    --out "/tmp/gf30/$name" --scenarios gpreempt-gate > "/tmp/gf30/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1-resume "--turn-ms 20" --bg 1 --requests 2000
cell bg1-daemon "--turn-ms 20 --no-watch-resume" --bg 1 --requests 2000
cell bg3-resume "--turn-ms 20" --bg 3 --requests 2000
cell bg3-daemon "--turn-ms 20 --no-watch-resume" --bg 3 --requests 2000
tar czf "$OUT/gf30.tgz" -C /tmp --exclude='*.png' gf30
python3 benchmarks/gate-frontier/table.py /tmp/gf30
