#!/usr/bin/env bash
# The gate's target cells: Case-A light (ResNet-50 fp16 batch 8, 2000 requests) or heavy (batch
# 64, 1000 requests) at load 0.5 beside one or three Case-B trainers, scenario gpreempt-gate.
# Nothing is set unless given as VAR=VALUE arguments (the gate's settings are unset first).
#
#   OUT=dir bash benchmarks/gate-frontier/target_cells.sh [VAR=VALUE...] [CELL...]
#     CELL: bg1 bg3 heavy-bg1 heavy-bg3 (default: all four)
#     e.g.  OUT=/tmp/b005 bash benchmarks/gate-frontier/target_cells.sh GPREEMPT_GATE_BARRIER_MS=0.05 bg1
#
# Writes OUT/bench/CELL/ (what `gpreempt bench` writes) and OUT/bench/CELL.log, then prints
# one line per cell (P99 ratio, B kept) and how Case-A's window divided between the server and
# the trainers. `bash benchmarks/compact.sh OUT` keeps only what is committed.
set -u
: "${OUT:?set OUT to an output directory}"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
unset GPREEMPT_GATE_BARRIER_MS GPREEMPT_REQUEST_LINGER_MS GPREEMPT_REQUEST_WARM
mkdir -p "$OUT/bench"
cells=()
dirs=()
for arg in "$@"; do
  case $arg in
    *=*) export "${arg?}"; echo "$arg" >> "$OUT/settings.txt" ;;
    bg1|bg3|heavy-bg1|heavy-bg3) cells+=("$arg") ;;
    *) echo "target_cells.sh: unknown cell '$arg' (use bg1, bg3, heavy-bg1, heavy-bg3 or VAR=VALUE)" >&2; exit 2 ;;
  esac
done
[ ${#cells[@]} -gt 0 ] || cells=(bg1 bg3 heavy-bg1 heavy-bg3)
python3 -m gpreempt.client.gate.build 2>&1 | tail -1
for name in "${cells[@]}"; do
  case $name in
    bg1) opts=(--bg 1 --requests 2000) ;;
    bg3) opts=(--bg 3 --requests 2000) ;;
    heavy-bg1) opts=(--case-a heavy --bg 1 --requests 1000) ;;
    heavy-bg3) opts=(--case-a heavy --bg 3 --requests 1000) ;;
  esac
  timeout 140 python3 -m gpreempt bench --no-nvml --warmup-s 1 "${opts[@]}" \
    --out "$OUT/bench/$name" --scenarios gpreempt-gate > "$OUT/bench/$name.log" 2>&1
  echo "$name rc=$?"
done
python3 benchmarks/gate-frontier/table.py "$OUT/bench"
for name in "${cells[@]}"; do dirs+=("$OUT/bench/$name"); done
python3 benchmarks/gate-frontier/window_states.py "${dirs[@]}" 2>&1 | tail -${#cells[@]}
