#!/usr/bin/env bash
# Three Case-B processes with the gate's window pinned tight (0.5 ms of GPU work in flight),
# and a live preemption seen through top, status and the metrics endpoint.
#   OUT=dir bash benchmarks/2026-11-21-h200/run-bg3-tight.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 75 bash benchmarks/validate/live_monitor.sh /tmp/live > "$OUT/live.txt" 2>&1
cp /tmp/live/top.txt /tmp/live/metrics.txt /tmp/live/events.txt "$OUT/" 2>/dev/null
GPREEMPT_GATE_MODE=tight GPREEMPT_GATE_WINDOW_MS=0.5 timeout 150 python3 -m gpreempt bench \
  --quick --bg 3 --out /tmp/bg3t --scenarios gpreempt-gate > "$OUT/bg3-tight.log" 2>&1
echo "bg3 tight rc=$?"
cp /tmp/bg3t/results.json "$OUT/bg3-tight-results.json"
cp /tmp/bg3t/report.md "$OUT/bg3-tight-report.md"
grep -A4 "P99 ratio |" /tmp/bg3t/report.md; grep -A4 "B kept |" /tmp/bg3t/report.md
grep -E "^gpreempt_(preemptions_total|tasks)" "$OUT/metrics.txt" | head; head -16 "$OUT/top.txt"
