#!/usr/bin/env bash
# Speed of `gpreempt analyze amd-log` on a synthetic HIP log in the runtime's exact format.
#   bash benchmarks/amd-log-speed/measure.sh OUT.json
set -eu
out=${1:?output json}
log=$(mktemp /tmp/gpreempt-amd-XXXX.log)
python3 -m gpreempt.monitor.synthetic_log "$log" --mb 300 --level 5 --processes 4
python3 - "$log" "$out" <<'PY'
import json, os, platform, resource, subprocess, sys, time
log, out = sys.argv[1], sys.argv[2]
start = time.perf_counter()
result = subprocess.run([sys.executable, "-m", "gpreempt", "analyze", "amd-log", log, "--json"],
                        capture_output=True, text=True, check=True)
seconds = time.perf_counter() - start
size = os.path.getsize(log)
summary = json.loads(result.stdout)["files"][0]
record = {
    "command": f"gpreempt analyze amd-log {os.path.basename(log)} --json (whole process)",
    "cpu": platform.processor() or platform.machine(),
    "bytes": size,
    "seconds": seconds,
    "mb_per_s": size / seconds / 1e6,
    "max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "lines": summary["lines"],
    "dispatches": summary["dispatches"],
    "unparsed_lines": summary["unparsed_lines"],
}
json.dump(record, open(out, "w"), indent=1)
print(json.dumps(record, indent=1))
PY
rm -f "$log"
