#!/usr/bin/env bash
# One prepared GPU check (no network needed): rollout tokens/s, RL step time under DeepSpeed ZeRO-2 and
# TRL's GRPOTrainer step on random-init Qwen2.5-0.5B / 1.5B-shaped models; prints one JSON line last.
# Usage: bash scripts/gpu_check.sh [--dry]      (--dry: tiny shape on CPU, checks that every part runs)
# Needs ragen2 installed with the bench extra (pip install -e .[bench]); vLLM is measured when it imports.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
PY="${PYTHON:-python3}"   # python3: some CUDA images have no plain `python`
if ! "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export DS_ACCELERATOR=cpu
fi
exec timeout 470 "$PY" benchmarks/gpu_check.py "$@"
