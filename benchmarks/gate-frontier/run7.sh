#!/usr/bin/env bash
# The lock behind the gate (mechanism auto) on work the gate cannot see, and how fast the
# daemon closes lower gates (no GPU needed for the latter; 16 cores here).
#   OUT=dir bash benchmarks/gate-frontier/run7.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
timeout 200 python3 benchmarks/validate/validate_gpu.py all --sections backstop \
  --out /tmp/val > "$OUT/validate_backstop.log" 2>&1
echo "validate rc=$?"; cp /tmp/val/validate.json "$OUT/validate_backstop.json"
for spec in "1 0" "3 0" "3 1"; do
  set -- $spec
  timeout 60 python3 benchmarks/daemon-reaction/measure.py --low "$1" --churn-ms "$2" \
    --trials 300 --out "$OUT/reaction-low$1-churn$2.json" | tee -a "$OUT/reaction.txt"
done
tail -8 "$OUT/validate_backstop.log"
