#!/usr/bin/env bash
# Every GPU test on the final barrier code; the stream-wait probe with the server's word set
# 1 ms before its kernels (does launching behind a held stream delay the other process?).
#   OUT=dir bash benchmarks/gate-frontier/run35.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 120 python3 -m pytest -q tests/gpu > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT/gpu_tests.txt"
timeout 90 python3 benchmarks/gate-frontier/stream_wait_probe.py --seconds 2 --every 1 \
  --ahead 256 --lead-ms 1 --out "$OUT/probe_every1_lead1.json" 2>&1 | tail -8
gzip -f "$OUT/probe_every1_lead1.json"
