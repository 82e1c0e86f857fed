#!/usr/bin/env bash
# What produced benchmarks/gate/<date>-<gpu>/: build, measure, CPU and GPU tests, on one GPU.
# Run from the repository root with OUT set to an output directory.
set -u
export GPREEMPT_CACHE_DIR=/tmp/gpreempt-cache
export PYTHONPATH=$PWD/src
if ! python3 -c "import gpreempt.client.gate" 2>$OUT/import_err.txt; then
  echo "package import failed, using a minimal copy"; mkdir -p /tmp/gp/gpreempt/client
  cp src/gpreempt/control.py src/gpreempt/errors.py src/gpreempt/config.py src/gpreempt/futex.py \
    /tmp/gp/gpreempt/
  touch /tmp/gp/gpreempt/__init__.py /tmp/gp/gpreempt/client/__init__.py
  cp -r src/gpreempt/client/gate src/gpreempt/client/csrc /tmp/gp/gpreempt/client/
  export PYTHONPATH=/tmp/gp
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( time python3 -m gpreempt.client.gate.build ) > $OUT/build.txt 2>&1; tail -4 $OUT/build.txt
timeout 330 python3 benchmarks/gate/measure_gate.py --out $OUT --rounds 3 --steps 30 > $OUT/measure.txt 2>&1; echo "measure rc=$?"
timeout 100 python3 -m pytest tests/test_gate.py -q -p no:cacheprovider -x > $OUT/pytest_cpu.txt 2>&1; echo "cpu tests rc=$?"; tail -2 $OUT/pytest_cpu.txt
timeout 150 python3 -m pytest tests/gpu/test_gate_gpu.py -q -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1; echo "gpu tests rc=$?"; tail -15 $OUT/pytest_gpu.txt
grep -v Warning $OUT/measure.txt | tail -30
