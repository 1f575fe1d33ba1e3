#!/usr/bin/env bash
# The CUDA checks and GPU throughput figures in one run (about 5-8 minutes on one H200):
# causality on CUDA, bf16 vs fp32 parity, the parallel policy sampler and sliding-window
# attention on the device, then bytes/s and MFU of the 147M preset for rl and uniform
# (eager, then torch.compile per block if time is left). Record the printed figures in
# BENCHMARKS.md. Without CUDA it runs a fast CPU self-test at smoke sizes.
#
#   bash benchmarks/gpu_check.sh [--steps N] [--json results.json] [--no-compile]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
LIMIT="${GPU_CHECK_TIMEOUT:-480}"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
exec timeout --signal=INT "$LIMIT" "$PY" benchmarks/gpu_check.py "$@"
