#!/usr/bin/env bash
# The defaults as they are now (stream barriers every 0.025 ms for mechanism gate while a more
# important task is registered, requests lingering 0.05 ms, 20 ms turns): the GPU tests, then
# the four target cells, load 0.5, no settings given.
#   OUT=dir bash benchmarks/gate-frontier/run49.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf49
python3 -m pytest -q tests/gpu > /tmp/gf49/gpu_tests.txt 2>&1; tail -1 /tmp/gf49/gpu_tests.txt
cell() {  # name, bench options...
  local name=$1; shift
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf49/$name" \
    --scenarios gpreempt-gate > "/tmp/gf49/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1 --bg 1 --requests 2000
cell bg3 --bg 3 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf49.tgz" -C /tmp --exclude='*.png' gf49
python3 benchmarks/gate-frontier/table.py /tmp/gf49
