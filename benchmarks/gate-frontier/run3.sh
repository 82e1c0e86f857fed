#!/usr/bin/env bash
# With the daemon's in-flight budget (default 0.75 ms per GPU): the four cells of the targets
# at 2000 requests (1000 heavy), first-kernel waits, and the GPU gate tests.
#   OUT=dir bash benchmarks/gate-frontier/run3.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 150 python3 -m pytest tests/gpu -q -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu tests rc=$?"; tail -1 "$OUT/pytest_gpu.txt"
mkdir -p /tmp/gf3
cell() {  # name, bench options...
  local name=$1; shift
  timeout 170 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" \
    --out "/tmp/gf3/$name" --scenarios gpreempt-gate > "/tmp/gf3/$name.log" 2>&1
  echo "$name rc=$?"
  python3 benchmarks/gate-frontier/outliers.py "/tmp/gf3/$name" > "/tmp/gf3/$name/outliers.json"
}
cell bg1 --bg 1 --requests 2000
cell bg3 --bg 3 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
timeout 200 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0,1 \
  --out /tmp/gf3/first_kernel.json > /tmp/gf3/first_kernel.log 2>&1
echo "first_kernel rc=$?"
tar czf "$OUT/gf3.tgz" -C /tmp --exclude='*.png' gf3
tail -10 /tmp/gf3/first_kernel.log
python3 benchmarks/gate-frontier/table.py /tmp/gf3
