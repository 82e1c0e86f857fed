#!/usr/bin/env bash
# The gate's cells at 2000 requests (1000 heavy), and the three-trainer frontier over the
# tight window.  OUT=dir bash benchmarks/gate-frontier/run2.sh
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m gpreempt.client.gate_build 2>&1 | tail -1
mkdir -p /tmp/gf2
cell() {  # name, bench options..., then optional env after --
  local name=$1; shift
  local opts=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  env "$@" timeout 170 python3 -m gpreempt bench --no-nvml --warmup-s 1 "${opts[@]}" \
    --out "/tmp/gf2/$name" --scenarios gpreempt-gate > "/tmp/gf2/$name.log" 2>&1
  echo "$name rc=$?"
  python3 benchmarks/gate-frontier/outliers.py "/tmp/gf2/$name" > "/tmp/gf2/$name/outliers.json"
}
cell bg1 --bg 1 --requests 2000
cell bg3-w0.25 --bg 3 --requests 2000 -- GPREEMPT_GATE_WINDOW_MS=0.25
cell bg3-w0.5 --bg 3 --requests 2000 -- GPREEMPT_GATE_WINDOW_MS=0.5
cell heavy-bg1 --case-a heavy --bg 1 --requests 1000
cell heavy-bg3 --case-a heavy --bg 3 --requests 1000
tar czf "$OUT/gf2.tgz" -C /tmp --exclude='*.png' gf2
python3 - <<'PY'
import json, pathlib
for d in sorted(pathlib.Path("/tmp/gf2").iterdir()):
    if d.is_dir() and (d / "results.json").exists():
        s = json.load(open(d / "results.json"))["scenarios"]["gpreempt-gate"]
        a = s["a_latency_ms"] or {}
        print(f"{d.name:12} p99 ratio {s['a_p99_ratio']:.2f} kept {s['b_kept']:.2f} p50 {a.get('p50', 0):.2f} p99 {a.get('p99', 0):.2f}")
PY
