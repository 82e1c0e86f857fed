#!/usr/bin/env bash
# The defaults as they are now (stream barriers every 0.025 ms for mechanism gate while a more
# important task is registered, requests lingering 0.05 ms, 20 ms turns), on another machine:
# the heavy cells and the light three-trainer cell, load 0.5, no settings given.
#   OUT=dir bash benchmarks/gate-frontier/run51.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf51
cell() {  # name, bench options...
  local name=$1; shift
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf51/$name" \
    --scenarios gpreempt-gate > "/tmp/gf51/$name.log" 2>&1
  echo "$name rc=$?"
}
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
cell bg3 --bg 3 --requests 2000
tar czf "$OUT/gf51.tgz" -C /tmp --exclude='*.png' gf51
python3 benchmarks/gate-frontier/table.py /tmp/gf51
