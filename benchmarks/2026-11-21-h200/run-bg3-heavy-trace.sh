#!/usr/bin/env bash
# Three Case-B processes, heavy Case-A, per-stream traces and a live monitoring check.
#   OUT=dir bash benchmarks/2026-11-21-h200/run-bg3-heavy-trace.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate.build 2>&1 | tail -1
timeout 200 python3 -m gpreempt bench --quick --bg 3 --out /tmp/bg3 \
  --scenarios time-sliced,gpreempt-signal,gpreempt-gate,gpreempt-auto > "$OUT/bg3.log" 2>&1
echo "bg3 rc=$?"
timeout 170 python3 -m gpreempt bench --quick --case-a heavy --requests 400 --out /tmp/heavy \
  --scenarios time-sliced,gpreempt-gate,gpreempt-auto > "$OUT/heavy.log" 2>&1
echo "heavy rc=$?"
for run in bg3 heavy; do
  rm -rf /tmp/$run/mps; cp /tmp/$run/report.md "$OUT/$run-report.md" 2>/dev/null
done
tar czf "$OUT/runs.tgz" -C /tmp bg3 heavy 2>/dev/null
timeout 60 python3 -m gpreempt analyze trace --warmup 8 --duration 3 --out /tmp/case_a.json --json \
  -- -m gpreempt.bench.workloads serve --calibrate 3000 --out /tmp/a_res.json > "$OUT/case_a_trace.json" 2>/dev/null
timeout 60 python3 -m gpreempt analyze trace --warmup 10 --duration 3 --out /tmp/case_b.json --json \
  -- -m gpreempt.bench.workloads train --out /tmp/b_res.json --max-seconds 40 > "$OUT/case_b_trace.json" 2>/dev/null
python3 -m gpreempt analyze trace --trace /tmp/case_a.json --trace /tmp/case_b.json > "$OUT/trace_compare.txt" 2>&1
timeout 80 bash benchmarks/validate/live_monitor.sh /tmp/live > "$OUT/live.txt" 2>&1
tar czf "$OUT/live.tgz" -C /tmp live
for run in bg3 heavy; do grep -A9 "| scenario | A served" "/tmp/$run/report.md"; done
tail -25 "$OUT/trace_compare.txt"
head -20 "$OUT/live.txt"
