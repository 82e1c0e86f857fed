#!/usr/bin/env bash
# What each suspension costs an eager trainer, and whether the driver-level gate costs it more
# than the operator gate: the Transformer that reads its loss every step (transformer-sync)
# under `gpreempt run --priority low` trains alone for 4 s, then beside periodic_server.py
# (about 1.3 ms of GPU work every 2.6 ms, so each request is one suspension) for 8 s. Per
# variant of the trainer's gate, server with or without request(), ROUNDS interleaved rounds.
#   OUT=dir bash benchmarks/driver_gate/transitions.sh  (or run.sh transitions)
# VARIANTS (default "default operator window2 spacing4"): default; operator: its operator gate
# alone (GPREEMPT_DRIVER_GATE=0); window2: at most 2 ms in flight; spacing4: barriers every
# 0.4 ms of GPU time. SERVERS (default "req noreq"), ROUNDS (default "1 2").
# A line per run in $OUT/transitions.txt: the trainer's steps/s alone and beside the server
# (kept = their ratio), the server's service time (mean, P99, ms), P99 of its lateness against
# its period, and the trainer's driver-level gate counters.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
: "${OUT:?set OUT to an output directory}"
python3 -m gpreempt.client.gate.build 2>&1 | tail -1
python3 -m gpreempt.client.gate.driver_build 2>&1 | tail -1
W=/tmp/gpreempt-transitions; rm -rf $W; mkdir -p $W "$OUT"
RD=$(mktemp -d /tmp/gpt-XXXX)
python3 -m gpreempt serve --runtime-dir "$RD" > $W/daemon.log 2>&1 &
dpid=$!; sleep 3
variant_env() { case $1 in
  default) echo "" ;; operator) echo "GPREEMPT_DRIVER_GATE=0" ;;
  window2) echo "GPREEMPT_GATE_OPEN_WINDOW_MS=2" ;; spacing4) echo "GPREEMPT_GATE_BARRIER_MS=0.4" ;;
  esac; }
for round in ${ROUNDS:-1 2}; do
  for v in ${VARIANTS:-default operator window2 spacing4}; do
    for srv in ${SERVERS:-req noreq}; do
      d=$W/$round-$v-$srv; mkdir -p $d
      env $(variant_env $v) python3 -m gpreempt run --runtime-dir "$RD" --priority low --name b -- \
        python3 -m gpreempt.bench.workloads train --kind transformer-sync --warmup-s 1 \
        --ready-file $d/ready --stop-file $d/stop --out $d/train.json > $d/train.log 2>&1 &
      tp=$!
      for _ in $(seq 600); do [ -f $d/ready ] && break; sleep 0.1; done
      t_alone=$(date +%s.%N); sleep 4
      extra=""; [ $srv = noreq ] && extra=--no-request
      python3 -m gpreempt run --runtime-dir "$RD" --priority high --name a -- \
        python3 benchmarks/driver_gate/periodic_server.py --out $d/server.json $extra \
        > $d/server.log 2>&1
      touch $d/stop; wait $tp
      python3 - "$d" "$t_alone" "$v" "$srv" "$round" <<'PY' | tee -a "$OUT/transitions.txt"
import json, sys
d, t_alone, v, srv, rnd = sys.argv[1], float(sys.argv[2]), *sys.argv[3:]
tr = json.load(open(d + "/train.json")); sv = json.load(open(d + "/server.json"))
ts = tr["step_end_t"]
alone = sum(1 for t in ts if t_alone <= t < t_alone + 4) / 4
lo, hi = sv["start"] + 0.5, sv["end"]
co = sum(1 for t in ts if lo <= t < hi) / (hi - lo)
drv = ((tr.get("gate") or {}).get("driver") or {})
print(f"{rnd} {v:9s} {srv:5s} alone {alone:5.1f}/s co {co:5.1f}/s kept {co/alone:.3f} "
      f"svc {sv['svc_mean']:.3f} p99 {sv['svc_p99']:.3f} lat99 {sv['lat_p99']:.2f} n {sv['n']} "
      f"waits {drv.get('driver_waits')} bound {drv.get('driver_bound_waits')} "
      f"barriers {drv.get('driver_barriers')} launches {drv.get('driver_launches')} "
      f"us/l {drv.get('driver_us_per_launch')}")
PY
    done
  done
done
kill $dpid; wait $dpid 2>/dev/null; rm -rf "$RD"
