#!/usr/bin/env bash
# Three Case-B trainers beside light Case-A, gate mechanism: where the slow requests fall.
#   OUT=dir bash benchmarks/gate-frontier/diagnose.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
run() {  # name, then env assignments
  local name=$1; shift
  env "$@" timeout 200 python3 -m gpreempt bench --quick --no-nvml --bg 3 --requests 400 \
    --out "/tmp/gf/$name" --scenarios gpreempt-gate > "/tmp/gf/$name.log" 2>&1
  echo "$name rc=$?"
  python3 benchmarks/gate-frontier/outliers.py "/tmp/gf/$name" > "/tmp/gf/$name/outliers.json"
  grep -A3 "P99 ratio |" "/tmp/gf/$name/report.md" | tail -1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('first100ms', d['slowest_in_first_100ms'], [(r['arrival_ms'], r['latency_ms'], r['queued_ms']) for r in d['slowest'][:8]])" "/tmp/gf/$name/outliers.json"
}
mkdir -p /tmp/gf
for spec in "$@"; do
  name=${spec%%:*}; vars=${spec#*:}
  # shellcheck disable=SC2086
  run "$name" $vars
done
tar czf "$OUT/gf.tgz" --exclude='*.png' -C /tmp gf
