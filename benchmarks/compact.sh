#!/usr/bin/env bash
# Keep what the repository commits of a result directory: summaries (results.json, report.md),
# logs, per-trainer counters (case-b-N.json), first-kernel trials; delete the raw per-request
# data, event logs, plots and marker files `gpreempt bench` also writes.
#   bash benchmarks/compact.sh DIR
set -u
dir=${1:?usage: bash benchmarks/compact.sh DIR}
[ -d "$dir" ] || { echo "compact.sh: $dir is not a directory" >&2; exit 2; }
find "$dir" -type f \( -name arrivals.json -o -name 'latency_cdf.json*' -o -name 'case-a.json*' \
  -o -name 'events.jsonl*' -o -name '*.png' -o -name '*.ready' -o -name '*.stop' \
  -o -name go.json -o -name calibrate.log \) -print -delete | wc -l | xargs echo "deleted files:"
du -sh "$dir"
