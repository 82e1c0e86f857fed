#!/usr/bin/env bash
# The driver-level gate's cells: trainers the operator hook never sees, beside the ResNet-50
# b8 graph server at load 0.5, with the defaults (gpreempt run --priority low|high, nothing
# else), the server marking its requests (gpreempt) or not (gpreempt-no-request); and the server
# alone under gpreempt run --priority high, marking them or not (a-alone-gated, ...-no-request).
#   OUT=dir bash benchmarks/driver_gate/run.sh GROUP [GROUP ...]
# Groups: cost (launch_cost.py), hold (hold_latency.py), residual (kernel_residual.py: what a
# request waits for of the PyTorch trainers' kernel in flight, which no barrier cuts),
# cold-start (cold_start.py: what the graph server's request pays for starting right after
# another process's work, with nothing left in flight, or while another process's stream waits
# at a barrier; twice, each time then under MPS), resume
# (resume_latency.cu: how soon a stream parked at a barrier runs again once its word drops,
# with or without another process's work in between; twice), server-spread (server_spread.py:
# the graph server's speed from one start of its process to the next, by how cuDNN chose its
# algorithms, or beside another process's idle memory; SPREAD_MODES: some of its modes, e.g.
# "heuristics,heuristics-ballast"), server-gated (server_gated.py: what gpreempt costs the graph
# server with nothing else on the GPU, part by part; ROUNDS, default 3), gpu-tests (every GPU
# test, tests/gpu, with this tree's src: pytest_gpu.txt), marks (barrier_cost.cu: what the
# parts of a mark cost the GPU and the CPU), parked (parked_channel.cu: whether a stream
# parked at a barrier, fed or not, slows another process's small kernels, launched with each
# of PARKED_GAPS us of CPU between them, default "20 0": an eager server, and one that keeps
# its GPU busy; requests of each of PARKED_SIZES, default 400x160: 400 requests of 160
# kernels; beside each of PARKED_MODES, default all of parked_channel.cu's), transitions
# (transitions.sh: what each suspension costs an eager trainer, per variant of its gate),
# request-cost (periodic_server.py alone under gpreempt run --priority high, 3 interleaved
# rounds of 6 s: its requests unmarked, marked with request(), and marked with no linger,
# GPREEMPT_REQUEST_LINGER_MS=0; a line each in request_cost.txt), light
# (the eager Transformer that reads its loss every step), operator-only (light with the
# trainer's operator gate alone, no driver-level gate: what the driver-level gate costs a
# PyTorch trainer), cupy, cupy-torch, jax,
# jax-torch, compiled, cpp (a CUDA C++ trainer, cpp_trainer.cu, built with nvcc), together (the
# built-in trainers of TRAINERS, default "transformer-sync transformer-compiled cupy-torch
# jax-torch", in one bench run: Case-A is measured alone once per repeat for all of them; each
# trainer's results go where its own group's would; an entry KIND+NAME=VALUE sets a variable for
# that trainer alone, e.g. TRAINERS="transformer-sync transformer-sync+GPREEMPT_DRIVER_GATE=0"
# compares the two gates side by side, its cell named after the entry), grace (each trainer of
# GRACE_TRAINERS, default "jax-torch", without request(), the server's idle grace set to each of
# GRACES ms, default "0 0.2 1": the frontier from which the default grace was chosen), spacing
# (light with the trainer's barriers spaced by each of SPACINGS ms of GPU time, default "0.1 0.2
# 0.4": what they cost it), window (light with at most each of WINDOWS ms of work in flight per
# stream, default "25 4 1", beside the server CASE_A, default light; eager: the eager ResNet-50).
# REPEATS (default 3) repeats; REQUESTS (default 1000) requests of Case-A per scenario; BENCH_ARGS:
# more options for every bench (e.g. BENCH_ARGS=--serve-args=--no-watch); CLOCKS=1
# samples the GPU's clocks beside each bench (gpu_clocks.py; the cell's clocks.jsonl.gz, which
# held_progress.py reads beside each run's slow requests). DEADLINE_S
# (seconds from the start, unset: none) stops a bench in time for its cell to be kept: a bench
# stopped keeps the repeats it finished. Each cell's results.json goes to $OUT/<cell>/
# (benchmarks/defaults/table.py prints it), with each gated run's per-request data and events
# gzipped in $OUT/<cell>/<run>-<scenario>/ for held_progress.py; a line per cell is printed, and
# what held_progress.py reads of each run, and the parts of its P99 (p99_parts.py).
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_IDLE_GRACE_MS GPREEMPT_REQUEST_LINGER_MS
: "${OUT:?set OUT to an output directory}"
: "${REPEATS:=3}" "${REQUESTS:=1000}"
work=${WORK:-/tmp/gpreempt-driver}  # the benches' own folders (WORK: another)
mkdir -p "$work" "$OUT"
python3 -m gpreempt.client.gate.build 2>&1 | tail -1
python3 -m gpreempt.client.gate.driver_build 2>&1 | tail -1
source benchmarks/deadline.sh
bench() {  # folder under $work, time limit (s), bench options...
  local name=$1 limit sampler="" rc
  local scenarios=gpreempt,gpreempt-no-request,a-alone-gated,a-alone-gated-no-request
  limit=$(deadline_limit "$2") || { echo "$name: skipped, DEADLINE_S is near"; return 1; }
  shift 2
  rm -rf "$work/$name" "$work/$name.clocks.jsonl"
  if [ -n "${CLOCKS:-}" ]; then  # the GPU's clocks beside the bench (gpu_clocks.py)
    python3 benchmarks/driver_gate/gpu_clocks.py --out "$work/$name.clocks.jsonl" \
      --seconds "$limit" & sampler=$!
  fi
  timeout "$limit" python3 -m gpreempt bench --no-nvml --warmup-s 1 --requests "$REQUESTS" \
    --repeats "$REPEATS" --scenarios "$scenarios" "$@" ${BENCH_ARGS:-} \
    --out "$work/$name" > "$work/$name.log" 2>&1
  rc=$?
  [ -n "$sampler" ] && { kill "$sampler"; wait "$sampler"; } 2>/dev/null
  echo "$name rc=$rc"
}
keep() {  # cell name, the bench folder it ran in[, the one holding its alone runs]
  local name=$1 dir=$2 alone=${3:-$2} clocks
  mkdir -p "$OUT/$name"
  cp "$dir/results.json" "$OUT/$name/" 2>/dev/null || echo "  $name: no results (see $work/*.log)"
  python3 benchmarks/defaults/table.py "$OUT/$name" 2>/dev/null | tail -4
  clocks=$(ls "$dir.clocks.jsonl" "$(dirname "$dir").clocks.jsonl" 2>/dev/null | head -1)
  [ -n "$clocks" ] && gzip -c "$clocks" > "$OUT/$name/clocks.jsonl.gz"
  for run in "$dir"/runs/r*/gpreempt* "$alone"/runs/r*/a-alone*; do  # alone: the host beside it
    [ -f "$run/case-a.json" ] || continue
    local kept="$OUT/$name/$(basename "$(dirname "$run")")-$(basename "$run")"
    mkdir -p "$kept"
    for f in case-a.json case-b-0.json events.jsonl; do
      [ -f "$run/$f" ] && gzip -c "$run/$f" > "$kept/$f.gz"
    done
    python3 benchmarks/driver_gate/held_progress.py ${clocks:+--clocks "$clocks"} "$kept" 2>&1 |
      sed -n '/^trainer steps/p;/^requests over/p;/^GPU /p;/^host /p;/suspend calls/p;/holds no/p' |
      sed "s|^|  $(basename "$kept"): |"
  done
  for run in "$OUT/$name"/r*-gpreempt*; do  # the P99's parts, where its alone run was kept
    [ -d "${run%%-gpreempt*}-a-alone" ] && python3 benchmarks/driver_gate/p99_parts.py "$run" |
      sed -n '/idle gated/p;/queued gated/p;/alone + switch/p' | sed "s|^|  $(basename "$run"):|"
  done
  echo "  leaks found: $(cat $(find "$dir" -name events.jsonl) 2>/dev/null |
    grep -c 'does not hold'), backstop locks: $(cat $(find "$dir" -name events.jsonl) \
    2>/dev/null | grep -c '"backstop"')"
}
cell() {  # name, bench options...
  bench "$1" $((REPEATS * 180 + 90)) "${@:2}" && keep "$1" "$work/$1"
}
cell_name() {  # the cell a built-in trainer's results go to
  case $1 in
    transformer-sync) echo light ;;
    transformer-compiled) echo compiled ;;
    *) echo "$1" ;;
  esac
}
for group in "$@"; do
  case $group in
    marks) nvcc -O2 -o "$work/barrier_cost" benchmarks/driver_gate/barrier_cost.cu -lcuda &&
      timeout 120 "$work/barrier_cost" | tee "$OUT/barrier_cost.txt" ;;
    parked) nvcc -O2 -o "$work/parked" benchmarks/driver_gate/parked_channel.cu -lcuda &&
      for round in 1 2 3; do
        for gap in ${PARKED_GAPS:-20 0}; do
          for size in ${PARKED_SIZES:-400x160}; do
            for mode in ${PARKED_MODES:-none idle held held3 heldfeed heldpair heldpoll heldpairpoll busy}; do
              [ $mode != none ] && { "$work/parked" $mode 30 & other=$!; sleep 1.5; }
              printf '%s gap %-3s %-8s %-8s ' $round "$gap" "$size" $mode |
                tee -a "$OUT/parked_channel.txt"
              timeout 60 "$work/parked" server ${size/x/ } "$gap" | tee -a "$OUT/parked_channel.txt"
              [ $mode != none ] && { kill $other; wait $other; } 2>/dev/null
              sleep 0.5
            done
          done
        done
      done ;;
    transitions) timeout 570 bash benchmarks/driver_gate/transitions.sh ;;
    server-gated) timeout 570 python3 benchmarks/driver_gate/server_gated.py \
      --rounds "${ROUNDS:-3}" --out "$OUT/server_gated.json" ;;
    request-cost) rd=$(mktemp -d /tmp/gpt-XXXX)  # what marking requests costs a server alone
      python3 -m gpreempt serve --runtime-dir "$rd" > "$work/request-cost-daemon.log" 2>&1 &
      dpid=$!; sleep 3
      for round in 1 2 3; do
        for v in noreq req linger0; do
          extra=""; vars=""
          [ $v = noreq ] && extra=--no-request
          [ $v = linger0 ] && vars=GPREEMPT_REQUEST_LINGER_MS=0
          rm -f "$work/request-cost.json"
          env $vars timeout 60 python3 -m gpreempt run --runtime-dir "$rd" --priority high \
            --name a -- python3 benchmarks/driver_gate/periodic_server.py --seconds 6 \
            --out "$work/request-cost.json" $extra > "$work/request-cost.log" 2>&1 ||
            tail -3 "$work/request-cost.log"
          echo "$round $v $(cat "$work/request-cost.json")" | tee -a "$OUT/request_cost.txt"
        done
      done
      kill $dpid; wait $dpid 2>/dev/null; rm -rf "$rd" ;;
    gpu-tests) timeout 590 python3 -m pytest -q -rfE --tb=short \
        -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -5 ;;
    hold) timeout 200 python3 benchmarks/driver_gate/hold_latency.py --out "$OUT/hold_latency.json" ;;
    residual) timeout 400 python3 benchmarks/driver_gate/kernel_residual.py \
        --out "$OUT/kernel_residual.json" ;;
    resume) nvcc -O2 -o "$work/resume_latency" benchmarks/driver_gate/resume_latency.cu -lcuda &&
      for n in 1 2; do timeout 60 "$work/resume_latency" 300 | tee "$OUT/resume-$n.json"; done ;;
    server-spread) timeout 400 python3 benchmarks/driver_gate/server_spread.py --rounds 6 \
        ${SPREAD_MODES:+--modes "$SPREAD_MODES"} --out "$OUT/server_spread.json" ;;
    cold-start) for n in 1 2; do for mps in "" --mps; do
        timeout 100 python3 benchmarks/driver_gate/cold_start.py $mps --rounds 300 \
          --out "$OUT/cold_start${mps:+-mps}-$n.json"; done; done ;;
    light) cell light --case-b transformer-sync ;;
    operator-only) cell light-operator-only --case-b transformer-sync \
        --env-b GPREEMPT_DRIVER_GATE=0 ;;
    cost) timeout 400 python3 benchmarks/driver_gate/launch_cost.py --rounds "${COST_ROUNDS:-6}" \
        --frameworks cuda,torch --cpus 4,5,6,7 --launches 20000 --out "$OUT/launch_cost.json" ;;
    cupy|cupy-torch|jax|jax-torch) cell "$group" --case-b "$group" ;;
    compiled) cell compiled --case-b transformer-compiled ;;
    grace) for trainer in ${GRACE_TRAINERS:-jax-torch}; do
        for grace in ${GRACES:-0 0.2 1}; do
          cell "$trainer-grace-$grace" --case-b "$trainer" --scenarios gpreempt-no-request \
            --env-a "GPREEMPT_IDLE_GRACE_MS=$grace"
        done
      done ;;
    spacing) for ms in ${SPACINGS:-0.1 0.2 0.4}; do
        cell "light-barriers-$ms" --case-b transformer-sync --env-b "GPREEMPT_GATE_BARRIER_MS=$ms"
      done ;;
    window) for ms in ${WINDOWS:-25 4 1}; do
        cell "${CASE_A:-light}-window-$ms" --case-a "${CASE_A:-light}" --case-b transformer-sync \
          --env-b "GPREEMPT_GATE_OPEN_WINDOW_MS=$ms"
      done ;;
    together) kinds=${TRAINERS:-transformer-sync transformer-compiled cupy-torch jax-torch}
      n=$(echo $kinds | wc -w)
      bench together $((REPEATS * (60 + 70 * n) + 90)) --case-b "$(echo $kinds | tr ' ' ,)"
      for kind in $kinds; do  # one trainer's bench writes its results in place
        keep "$(cell_name "$kind")" "$work/together$([ "$n" -gt 1 ] && echo "/$kind")" \
          "$work/together"  # the server alone ran once per repeat for all of them
      done ;;
    cpp) nvcc -O2 -o "$work/cpp_trainer" benchmarks/driver_gate/cpp_trainer.cu &&
      cell cpp --case-b-cmd "$work/cpp_trainer" ;;
    *) echo "unknown group $group" ;;
  esac
done
