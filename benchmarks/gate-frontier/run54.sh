#!/usr/bin/env bash
# Stream-barrier spacing against B kept, same machine: one trainer under heavy Case-A with
# barriers every 0.025 ms (the default), 0.05 ms and 0.1 ms, and under light Case-A with the
# default, 0.05 ms and 0.1 ms; load 0.5. The GPU's SM clock and power are sampled every 100 ms
# throughout (nvidia-smi, read only) to see whether co-location lowers the clocks.
#   OUT=dir bash benchmarks/gate-frontier/run54.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf54
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv,nounits -lms 100 > /tmp/gf54/clocks.csv 2>&1 &
SMI=$!
cell() {  # name, barrier ms ("" = default), bench options...
  local name=$1 barrier=$2; shift 2
  echo "$name start $(date +%s.%N)" >> /tmp/gf54/cells.txt
  if [ -n "$barrier" ]; then export GPREEMPT_GATE_BARRIER_MS=$barrier; else unset GPREEMPT_GATE_BARRIER_MS; fi
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --out "/tmp/gf54/$name" \
    --scenarios gpreempt-gate > "/tmp/gf54/$name.log" 2>&1
  echo "$name rc=$?"
  echo "$name end $(date +%s.%N)" >> /tmp/gf54/cells.txt
}
cell heavy-bg1 "" --case-a heavy --bg 1 --requests 1000
cell heavy-bg1-b005 0.05 --case-a heavy --bg 1 --requests 1000
cell heavy-bg1-b01 0.1 --case-a heavy --bg 1 --requests 1000
cell bg1 "" --bg 1 --requests 2000
cell bg1-b005 0.05 --bg 1 --requests 2000
cell bg1-b01 0.1 --bg 1 --requests 2000
kill $SMI
tar czf "$OUT/gf54.tgz" -C /tmp --exclude='*.png' gf54
python3 benchmarks/gate-frontier/table.py /tmp/gf54
python3 benchmarks/gate-frontier/window_states.py /tmp/gf54/*/ 2>&1 | grep -v "^$" | tail -8
