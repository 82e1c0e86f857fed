#!/usr/bin/env bash
# Gates that watch the more important tasks' activity directly: first-kernel waits with the
# watch (the default) and without it (`serve --no-watch`), side by side; then the light cells
# with one and three trainers on the default.   OUT=dir bash benchmarks/gate-frontier/run14.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
fk() {  # name, first_kernel options...
  local name=$1; shift
  timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 "$@" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"
  gzip -f "$OUT/$name.json"
}
fk first_kernel_watch
fk first_kernel_nowatch --serve-args=--no-watch
mkdir -p /tmp/gf14
for bg in 1 3; do
  timeout 170 python3 -m gpreempt bench --no-nvml --warmup-s 1 --bg $bg --requests 2000 \
    --out "/tmp/gf14/bg$bg" --scenarios gpreempt-gate > "/tmp/gf14/bg$bg.log" 2>&1
  echo "bg$bg rc=$?"
done
tar czf "$OUT/gf14.tgz" -C /tmp --exclude='*.png' gf14
tail -9 "$OUT/first_kernel_watch.log"; tail -9 "$OUT/first_kernel_nowatch.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf14
