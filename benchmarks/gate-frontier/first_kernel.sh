#!/usr/bin/env bash
# How long a high-priority process's first kernel waits behind 0, 1 and 3 gated trainers, timed
# on the GPU's clock put on the host's (first_kernel.py's "queued"), without a hint, with a hint
# and no lead, and with `request()` entered 1 ms before the launch; once per setting.
#
#   OUT=dir [TRIALS=400] bash benchmarks/gate-frontier/first_kernel.sh [SETTING...]
#     SETTING: default (nothing set), no-barriers (GPREEMPT_GATE_BARRIER_MS=0),
#              warm (GPREEMPT_REQUEST_WARM=1), no-warm (GPREEMPT_REQUEST_WARM=0)
#     (default: default no-barriers)
#
# Writes OUT/first_kernel_SETTING.json.gz (every trial) and OUT/first_kernel_SETTING.log (the
# table, also printed).
set -u
: "${OUT:?set OUT to an output directory}"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(default no-barriers)
mkdir -p "$OUT"
python3 -m gpreempt.client.gate.build 2>&1 | tail -1
for setting in "${settings[@]}"; do
  unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS GPREEMPT_REQUEST_WARM
  case $setting in
    default) ;;
    no-barriers) export GPREEMPT_GATE_BARRIER_MS=0 ;;
    warm) export GPREEMPT_REQUEST_WARM=1 ;;
    no-warm) export GPREEMPT_REQUEST_WARM=0 ;;
    *) echo "first_kernel.sh: unknown setting '$setting' (use default, no-barriers, warm, no-warm)" >&2; exit 2 ;;
  esac
  timeout 250 python3 benchmarks/gate-frontier/first_kernel.py --trials "${TRIALS:-400}" \
    --prep-ms 0,1 --trainers 0,1,3 --out "$OUT/first_kernel_$setting.json" \
    > "$OUT/first_kernel_$setting.log" 2>&1
  echo "first_kernel $setting rc=$?"
  gzip -f "$OUT/first_kernel_$setting.json"
  tail -11 "$OUT/first_kernel_$setting.log"
done
