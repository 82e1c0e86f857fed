#!/usr/bin/env bash
# Daemon reaction again, after gates close before the event log is written.
#   OUT=dir bash benchmarks/gate-frontier/run8.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
for spec in "1 0" "3 0" "3 1"; do
  set -- $spec
  timeout 60 python3 benchmarks/daemon-reaction/measure.py --low "$1" --churn-ms "$2" \
    --trials 300 --out "$OUT/reaction-low$1-churn$2.json" | tee -a "$OUT/reaction.txt"
done
