#!/usr/bin/env bash
# The four target cells at 2000 requests (1000 heavy) with the futex wake-up, and the
# one-trainer cell a second time to see how much a cell moves between two runs.
#   OUT=dir bash benchmarks/gate-frontier/run10.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf10
cell() {  # name, bench options...
  local name=$1; shift
  timeout 170 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" \
    --out "/tmp/gf10/$name" --scenarios gpreempt-gate > "/tmp/gf10/$name.log" 2>&1
  echo "$name rc=$?"
  python3 benchmarks/gate-frontier/outliers.py "/tmp/gf10/$name" > "/tmp/gf10/$name/outliers.json"
}
cell bg1 --bg 1 --requests 2000
cell bg3 --bg 3 --requests 2000
cell bg1-again --bg 1 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf10.tgz" -C /tmp --exclude='*.png' gf10
python3 benchmarks/gate-frontier/table.py /tmp/gf10
