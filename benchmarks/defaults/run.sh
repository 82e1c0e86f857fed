#!/usr/bin/env bash
# The defaults' cells (gpreempt run --priority low|high, nothing else set), on GPU 0.
#   OUT=dir bash benchmarks/defaults/run.sh GROUP [GROUP ...]
# Groups: overhead (measure_gate.py: what the defaults cost a trainer with a more important
# task registered but idle, five configurations), overhead-long (the defaults against no gate
# only, 70 rounds, once free and once pinned to four CPUs), server-gate (server_gate.py: what
# its own gate costs an eager server), light, light6 and light6-no-request (light's two
# scenarios, 6 repeats), light3, light3-no-request, heavy3, cupy, compiled, eager,
# eager-no-barriers, sweep, grace, eager-grace (grace for the eager server without
# request()), sleep-often (light and compiled with the trainers' gates let sleep after
# SLEEP_AFTER s of the server's idleness, default 0.001: they then sleep between requests
# too), budget (light without request() under the daemon's in-flight budgets BUDGETS, default
# 1 and 0.5 ms), servers (servers as people run them, gpreempt.bench.servers: the eager
# ResNet-50 and GPT-2 `generate` of NEW_TOKENS tokens, default 8, in process with and without
# request(); the eager ResNet-50 behind FastAPI under uvicorn, a request one HTTP POST from the
# open-loop Poisson client, its requests marked with no code, unmarked with
# GPREEMPT_AUTO_REQUESTS=0, and with request() by hand; HTTP_FN=gpreempt.bench.servers:gpt2_generate
# serves GPT-2 over HTTP instead; SERVER_CELLS picks among eager http http-unmarked
# http-by-hand generate, default all five, or eager-ungated: the eager server without its
# operator gate, GPREEMPT_GATE=0, its activity told by the driver-level gate; needs fastapi,
# uvicorn and, for generate, transformers).
# Every bench cell runs 1000 requests of Case-A at load 0.5 (unless named), 3 repeats
# (REPEATS; 1 for grace and 2 for eager-grace, whose GRACES choose the graces; 6 for light6
# and light6-no-request; EAGER_SCENARIOS chooses eager's; servers-generate runs
# GENERATE_REQUESTS requests, default 400, its scenarios GENERATE_SCENARIOS, the other servers
# cells SERVER_REQUESTS, default 1000). Each cell's results.json goes to $OUT/<cell>/ (table.py
# prints it); a table is printed. Each cell's Case-B gate counters go to
# $OUT/<cell>/gate_counters.json. DEADLINE_S
# (seconds from the start, unset: none) stops a bench in time: it keeps the repeats it finished.
set -u
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 GPREEMPT_CACHE_DIR=/tmp/gpreempt-cache
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_IDLE_GRACE_MS GPREEMPT_REQUEST_LINGER_MS
: "${OUT:?set OUT to an output directory}"
: "${REPEATS:=3}"
work=${WORK:-/tmp/gpreempt-defaults}  # the benches' own folders (WORK: another)
mkdir -p "$work" "$OUT"
python3 -m gpreempt.client.gate.build 2>&1 | tail -1
source benchmarks/deadline.sh
cell() {  # name, timeout s, bench options...
  local name=$1 limit
  limit=$(deadline_limit "$2") || { echo "$name: skipped, DEADLINE_S is near"; return 1; }
  shift 2
  rm -rf "$work/$name"
  timeout "$limit" python3 -m gpreempt bench --no-nvml --warmup-s 1 --requests 1000 "$@" \
    --out "$work/$name" > "$work/$name.log" 2>&1
  echo "$name rc=$?"
  mkdir -p "$OUT/$name"
  cp "$work/$name/results.json" "$OUT/$name/" 2>/dev/null
  python3 benchmarks/defaults/gate_counters.py "$work/$name" "$OUT/$name/gate_counters.json"
}
for group in "$@"; do
  case $group in
    overhead)
      timeout 330 python3 benchmarks/gate/measure_gate.py --out "$OUT/overhead" --rounds 36 \
        --steps 12 --heavy-rounds 12 --heavy-steps 8 \
        --phases overhead_defaults,overhead_defaults_sync,overhead_defaults_heavy \
        > "$OUT/overhead.txt" 2>&1
      echo "overhead rc=$?"; grep -E "overhead_defaults" "$OUT/overhead.txt"
      gzip -f "$OUT/overhead/gate_measure.json" ;;
    overhead-long) for v in free pinned; do  # pinned: on CPUs 8-11 only
        pin=(); [ "$v" = pinned ] && pin=(--cpus 8-11)
        mkdir -p "$OUT/overhead-long"
        timeout 270 python3 benchmarks/gate/measure_gate.py --out "$OUT/overhead-long/$v" \
          --rounds 70 --steps 12 --phases overhead_defaults,overhead_defaults_sync \
          --defaults-configs defaults_idle_server "${pin[@]}" > "$OUT/overhead-long/$v.txt" 2>&1
        echo "overhead-long $v rc=$?"; grep -E "overhead_defaults" "$OUT/overhead-long/$v.txt"
        gzip -f "$OUT/overhead-long/$v/gate_measure.json"
      done ;;
    server-gate)
      timeout 300 python3 benchmarks/defaults/server_gate.py --out "$OUT/server_gate" --rounds 8 \
        > "$OUT/server_gate.txt" 2>&1
      echo "server-gate rc=$?"; tail -5 "$OUT/server_gate.txt" ;;
    light) cell light 420 --repeats "$REPEATS" --case-b transformer-sync \
      --scenarios gpreempt,gpreempt-no-request ;;
    light6) cell light6 560 --repeats 6 --case-b transformer-sync --scenarios gpreempt ;;
    light6-no-request) cell light6-no-request 560 --repeats 6 --case-b transformer-sync \
      --scenarios gpreempt-no-request ;;
    light3) cell light3 480 --repeats "$REPEATS" --case-b transformer-sync --bg 3 \
      --scenarios gpreempt,gpreempt-no-request ;;
    light3-no-request) cell light3-no-request 480 --repeats "$REPEATS" --case-b transformer-sync \
      --bg 3 --scenarios gpreempt-no-request ;;
    heavy3) cell heavy3 480 --repeats "$REPEATS" --case-a heavy --bg 3 --scenarios gpreempt ;;
    cupy) cell cupy 420 --repeats "$REPEATS" --case-b cupy --scenarios gpreempt,gpreempt-lock ;;
    compiled) cell compiled 480 --repeats "$REPEATS" --case-b transformer-compiled \
      --scenarios gpreempt,gpreempt-gate ;;
    eager) cell eager 570 --repeats "$REPEATS" --case-a eager --case-b transformer-sync \
      --scenarios "${EAGER_SCENARIOS:-gpreempt,gpreempt-no-request}" ;;
    eager-no-barriers) GPREEMPT_GATE_BARRIER_MS=0 cell eager-no-barriers 420 \
      --repeats "$REPEATS" --case-a eager --case-b transformer-sync --scenarios gpreempt ;;
    sweep) for load in 0.2 0.8; do
        cell "load-$load" 420 --repeats "$REPEATS" --load "$load" \
          --case-b transformer-sync --scenarios gpreempt
      done ;;
    grace) for grace in ${GRACES:-0 0.2 1}; do
        GPREEMPT_IDLE_GRACE_MS=$grace cell "grace-$grace" 300 --repeats 1 \
          --case-b transformer-sync --scenarios gpreempt-no-request
      done ;;
    sleep-often) for cb in transformer-sync transformer-compiled; do
        cell "sleep-${SLEEP_AFTER:-0.001}-$cb" 420 --repeats "$REPEATS" --case-b "$cb" \
          --scenarios gpreempt,gpreempt-no-request --serve-args="--sleep-after-s=${SLEEP_AFTER:-0.001}"
      done ;;
    budget) for budget in ${BUDGETS:-1 0.5}; do
        cell "budget-$budget" 300 --repeats "$REPEATS" --case-b transformer-sync \
          --scenarios gpreempt-no-request --serve-args="--inflight-budget-ms=$budget"
      done ;;
    eager-grace) for grace in ${GRACES:-0 0.5 2}; do
        GPREEMPT_IDLE_GRACE_MS=$grace cell "eager-grace-$grace" 300 --repeats 2 --case-a eager \
          --case-b transformer-sync --scenarios gpreempt-no-request
      done ;;
    servers)
      python3 -c "import fastapi, uvicorn, transformers" 2>/dev/null \
        || echo "servers: pip install fastapi uvicorn transformers first"
      for server in ${SERVER_CELLS:-eager http http-unmarked http-by-hand generate}; do
        case $server in
          eager) cell servers-eager 570 --repeats "$REPEATS" --requests "${SERVER_REQUESTS:-1000}" \
              --case-a eager --case-b transformer-sync --scenarios gpreempt,gpreempt-no-request ;;
          eager-ungated) cell servers-eager-ungated 570 --repeats "$REPEATS" \
              --requests "${SERVER_REQUESTS:-1000}" --case-a eager --case-b transformer-sync \
              --env-a GPREEMPT_GATE=0 --scenarios gpreempt,gpreempt-no-request ;;
          http|http-unmarked|http-by-hand)
            GPREEMPT_BENCH_HTTP_FN=${HTTP_FN:-gpreempt.bench.servers:resnet_eager} \
              cell "servers-$server" 720 --repeats "$REPEATS" \
              --requests "${SERVER_REQUESTS:-1000}" --case-a-fn "gpreempt.bench.servers:${server//-/_}" \
              --case-b transformer-sync --scenarios gpreempt-no-request ;;
          generate) GPREEMPT_BENCH_NEW_TOKENS=${NEW_TOKENS:-8} cell servers-generate 1500 \
              --repeats "$REPEATS" --requests "${GENERATE_REQUESTS:-400}" \
              --case-a-fn gpreempt.bench.servers:gpt2_generate --case-b transformer-sync \
              --scenarios "${GENERATE_SCENARIOS:-gpreempt,gpreempt-no-request}" ;;
          *) echo "unknown server cell $server"; exit 2 ;;
        esac
      done ;;
    *) echo "unknown group $group"; exit 2 ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$work" --exclude='*.png' --exclude='latency_cdf*' --exclude='runs' . 2>/dev/null
python3 benchmarks/defaults/table.py "$OUT"/*/ 2>&1 | grep -v "no results.json"
