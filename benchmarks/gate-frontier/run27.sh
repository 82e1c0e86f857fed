#!/usr/bin/env bash
# Where turns lose throughput: three trainers in 20 ms turns at load 0.5 (with the trainers'
# gate counters) and at load 0.1, and side by side at load 0.1.
#   OUT=dir bash benchmarks/gate-frontier/run27.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf27
cell() {  # name, serve args, bench options...
  local name=$1 serve=$2; shift 2
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "$@" --serve-args="$serve" \
    --out "/tmp/gf27/$name" --scenarios gpreempt-gate > "/tmp/gf27/$name.log" 2>&1
  echo "$name rc=$?"
}
cell bg3-turns "--turn-ms 20" --bg 3 --requests 2000
cell bg3-turns-load0.1 "--turn-ms 20" --bg 3 --load 0.1 --requests 400
cell bg3-side-load0.1 "--turn-ms 0" --bg 3 --load 0.1 --requests 400
tar czf "$OUT/gf27.tgz" -C /tmp --exclude='*.png' gf27
python3 benchmarks/gate-frontier/table.py /tmp/gf27
python3 - <<'PY'
import json
for i in range(3):
    g = json.load(open(f"/tmp/gf27/bg3-turns/runs/r0/gpreempt-gate/case-b-{i}.json"))["gate"] or {}
    costs = sorted(g.get("op_costs", []), key=lambda c: -c[1] * c[2])[:6]
    keys = ("window_us", "us_per_launch", "bound_waits", "bound_wait_seconds", "waits",
            "wait_seconds", "launches", "work_seconds",
            "samples_taken", "samples_dropped")
    print(i, {k: g.get(k) for k in keys})
    print("  ", [(c[0], c[1], round(c[2], 1)) for c in costs])
PY
