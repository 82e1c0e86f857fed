#!/usr/bin/env bash
# The warm-up on request() and the futex wake-up: GPU tests (torch.compile under the gate
# included), and first-kernel waits for several hint leads, with and without the warm-up, at
# in-flight budgets 0.75 and 0.4 ms.   OUT=dir bash benchmarks/gate-frontier/run9.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 240 python3 -m pytest tests/gpu -q -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu tests rc=$?"; tail -1 "$OUT/pytest_gpu.txt"
fk() {  # name, first_kernel options...
  local name=$1; shift
  timeout 240 python3 benchmarks/gate-frontier/first_kernel.py --trials 200 "$@" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"
  gzip -f "$OUT/$name.json"
}
fk first_kernel --budgets 0.75 --prep-ms 0,1,2 --cold
fk first_kernel_b0.4 --budgets 0.4 --prep-ms 1
tail -24 "$OUT/first_kernel.log"; tail -10 "$OUT/first_kernel_b0.4.log"
