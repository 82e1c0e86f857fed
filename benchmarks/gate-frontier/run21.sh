#!/usr/bin/env bash
# The default in-flight budget raised to 1.0 ms, with per-operator costs: the four target cells
# and first-kernel waits.   OUT=dir bash benchmarks/gate-frontier/run21.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf21
cell() {  # name, bench options...
  local name=$1; shift
  timeout 120 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" \
    --out "/tmp/gf21/$name" --scenarios gpreempt-gate > "/tmp/gf21/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1 --bg 1 --requests 2000
cell bg3 --bg 3 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
timeout 120 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --out "$OUT/first_kernel.json" > "$OUT/first_kernel.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel.json"
tar czf "$OUT/gf21.tgz" -C /tmp --exclude='*.png' gf21
tail -10 "$OUT/first_kernel.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf21
