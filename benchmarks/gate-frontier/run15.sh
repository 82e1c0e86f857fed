#!/usr/bin/env bash
# The watch, A/B on one machine: three trainers with and without it, and first-kernel waits
# without it (run14 has them with it).   OUT=dir bash benchmarks/gate-frontier/run15.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf15
cell() {  # name, serve args
  timeout 170 python3 -m gpreempt bench --no-nvml --warmup-s 1 --bg 3 --requests 2000 \
    --serve-args="$2" --out "/tmp/gf15/$1" --scenarios gpreempt-gate > "/tmp/gf15/$1.log" 2>&1
  echo "$1 rc=$?"
}
cell bg3-watch ""
cell bg3-nowatch "--no-watch"
timeout 150 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --serve-args=--no-watch --out "$OUT/first_kernel_nowatch.json" > "$OUT/first_kernel_nowatch.log" 2>&1
echo "first_kernel_nowatch rc=$?"
gzip -f "$OUT/first_kernel_nowatch.json"
tar czf "$OUT/gf15.tgz" -C /tmp --exclude='*.png' gf15
tail -9 "$OUT/first_kernel_nowatch.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf15
