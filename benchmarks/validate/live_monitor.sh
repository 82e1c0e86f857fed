#!/usr/bin/env bash
# A live preemption seen through `gpreempt top --once`, `gpreempt status` and the metrics endpoint.
#   bash benchmarks/validate/live_monitor.sh OUTDIR
set -u
out=${1:?output directory}
mkdir -p "$out"
rt=$(mktemp -d /tmp/gp-live-XXXX)
export GPREEMPT_RUNTIME_DIR=$rt PYTHONPATH=${PYTHONPATH:-src}
python3 -m gpreempt serve --metrics-port 9477 2> "$out/serve.log" &
daemon=$!
sleep 2
python3 -m gpreempt run --priority low --name trainer -- \
  python3 -m gpreempt.bench.workloads train --max-seconds 25 --out "$out/b.json" > /dev/null 2>&1 &
trainer=$!
sleep 12
python3 -m gpreempt run --priority high --name server -- python3 -c '
import time, torch, gpreempt
x = torch.randn(4096, 4096, device="cuda")
for _ in range(800):
    with gpreempt.request():
        (x @ x).sum().item()
    time.sleep(0.01)
' &
server=$!
sleep 8  # the server imports torch and starts its requests
python3 -m gpreempt top --once > "$out/top.txt" 2>&1
python3 -m gpreempt status --json > "$out/status.json" 2>&1
python3 - "$out/metrics.txt" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:9477/metrics", timeout=5).read().decode()
open(sys.argv[1], "w").write(text)
PY
wait $server
kill $trainer 2>/dev/null; wait $trainer 2>/dev/null
kill $daemon; wait $daemon
python3 -m gpreempt events --last 0 > "$out/events.txt"
grep -E "^gpreempt_(preemptions_total|tasks|preempt_latency_seconds_count)" "$out/metrics.txt" | head -12
cat "$out/top.txt" | head -30
