#!/usr/bin/env bash
# The code as committed: GPU tests, the four target cells with per-operator costs at the default
# in-flight budget, three trainers at a budget of 1.0 ms and their first-kernel waits.
#   OUT=dir bash benchmarks/gate-frontier/run20.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -2 "$OUT/gpu_tests.txt"
mkdir -p /tmp/gf20
cell() {  # name, bench options...
  local name=$1; shift
  timeout 120 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" \
    --out "/tmp/gf20/$name" --scenarios gpreempt-gate > "/tmp/gf20/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg1 --bg 1 --requests 2000
cell bg3 --bg 3 --requests 2000
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
cell bg3-b1.0 --bg 3 --requests 2000 --serve-args=--inflight-budget-ms=1.0
timeout 80 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 --prep-ms 0 \
  --trainers 0,3 --budgets 1.0 --out "$OUT/first_kernel_b1.0.json" > "$OUT/first_kernel_b1.0.log" 2>&1
echo "first_kernel rc=$?"
gzip -f "$OUT/first_kernel_b1.0.json"
tar czf "$OUT/gf20.tgz" -C /tmp --exclude='*.png' gf20
tail -3 "$OUT/first_kernel_b1.0.log"
python3 benchmarks/gate-frontier/table.py /tmp/gf20
