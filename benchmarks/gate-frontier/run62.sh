#!/usr/bin/env bash
# The light target cells with requests warming the GPU (the default from run61 on), nothing
# set: three trainers in 20 ms turns, then one trainer; each copied out as it ends.
#   OUT=dir bash benchmarks/gate-frontier/run62.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS GPREEMPT_REQUEST_WARM
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf62
cell() {  # name, bench options...
  local name=$1; shift
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf62/$name" \
    --scenarios gpreempt-gate > "/tmp/gf62/$name.log" 2>&1
  echo "$name rc=$?"
  tar czf "$OUT/gf62-$name.tgz" -C /tmp/gf62 --exclude='*.png' "$name" "$name.log"
  python3 benchmarks/gate-frontier/table.py /tmp/gf62 | grep "^$name "
}
cell bg3 --bg 3 --requests 2000
cell bg1 --bg 1 --requests 2000
