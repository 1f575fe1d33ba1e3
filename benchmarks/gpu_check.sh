#!/usr/bin/env bash
# The CUDA checks and GPU throughput figures in one run (about 6-9 minutes on one H200):
# causality on CUDA, bf16 vs fp32 parity, the parallel policy sampler and sliding-window
# attention on the device, host syncs per training step (static and dynamic chunk shapes), the
# 147M preset's bytes/s, MFU and peak memory for rl and uniform (eager, dynamic shapes, then
# torch.compile per block if time is left), the whole loss under fullgraph compile; then cached
# generation at batch 1 and 32 and a few steps of `torchrun` on NCCL. Results go to
# $GPU_CHECK_OUT (default results/gpu/) as they come: gpu_check.json, generate.jsonl, the logs.
# Without CUDA it runs a fast CPU self-test of the Python part at smoke sizes.
#
#   bash benchmarks/gpu_check.sh [--steps N] [--no-compile] [--no-fullgraph]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python}"
LIMIT="${GPU_CHECK_TIMEOUT:-420}"
OUT_DIR="${GPU_CHECK_OUT:-results/gpu}"
mkdir -p "$OUT_DIR"
cuda=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  cuda=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/nvidia-smi.txt"
fi
timeout --signal=INT "$LIMIT" "$PY" benchmarks/gpu_check.py --json "$OUT_DIR/gpu_check.json" "$@" 2>&1 \
  | tee "$OUT_DIR/gpu_check.log"
rc=${PIPESTATUS[0]}
if [ "$cuda" = 1 ]; then
  # cached decoding against re-running the model per byte, at batch 1 and 32
  timeout 90 "$PY" benchmarks/generate.py --device cuda --dtype bf16 --contexts 2048 --batches 1,32 \
    --new-bytes 64 --rerun-bytes 4 --repeats 2 --json "$OUT_DIR/generate.jsonl" 2>&1 | tee "$OUT_DIR/generate.log"
  # torchrun on NCCL: a few optimizer steps of a smoke model on this repository's own text
  corpus=/tmp/rltok-gpu-corpus.jsonl
  "$PY" - "$corpus" <<'EOF'
import json, pathlib, sys
with open(sys.argv[1], "w") as f:
    for p in sorted(pathlib.Path("rltok").rglob("*.py")):
        f.write(json.dumps({"text": p.read_text()}) + "\n")
EOF
  rm -rf /tmp/rltok-nccl
  timeout 90 "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m rltok train --method rl --preset smoke \
    --data "$corpus" --out /tmp/rltok-nccl --steps 20 --device cuda --no-progress 2>&1 | tee "$OUT_DIR/torchrun.log"
  echo "torchrun rc=${PIPESTATUS[0]}" | tee -a "$OUT_DIR/torchrun.log"
  cp /tmp/rltok-nccl/summary.json "$OUT_DIR/torchrun_summary.json" 2>/dev/null || true
fi
exit "$rc"
