#!/usr/bin/env bash
# Keep what the repository commits of a result directory: the summaries (results.json, and
# gate_counters.json where a script wrote one) and first-kernel trials; delete the raw
# per-request data, per-trainer step files, event logs, logs, reports, plots and marker files
# `gpreempt bench` also writes (`benchmarks/defaults/table.py` prints a cell's results.json).
#   bash benchmarks/compact.sh DIR
set -u
dir=${1:?usage: bash benchmarks/compact.sh DIR}
[ -d "$dir" ] || { echo "compact.sh: $dir is not a directory" >&2; exit 2; }
find "$dir" -type f \( -name arrivals.json -o -name 'latency_cdf.json*' -o -name 'case-a.json*' \
  -o -name 'case-b-*.json*' -o -name 'events.jsonl*' -o -name '*.png' -o -name '*.ready' \
  -o -name '*.stop' -o -name go.json -o -name '*.log' -o -name report.md \
  -o -name timeline.json -o -name scenario.json -o -name calibration.json \) -print -delete |
  wc -l | xargs echo "deleted files:"
du -sh "$dir"
