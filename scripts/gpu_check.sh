#!/usr/bin/env bash
# One prepared GPU check (no network needed): our GRPO step under DeepSpeed ZeRO-2 and ZeRO-0 (FusedAdam
# on CUDA), TRL's GRPOTrainer step and the compiled decode step (rollout.compile) on random-init
# Qwen2.5-0.5B / 1.5B-shaped models; prints one JSON line last (benchmarks/gpu_check.py).
# Usage: bash scripts/gpu_check.sh [--dry]      (--dry: tiny shape on CPU, checks that every part runs)
# Parts stop starting at 360 s and the process is stopped at 380 s, so that with scripts/gpu_check_device.sh's
# FusedAdam build (about a minute) the whole check fits in 8 minutes.
# Needs ragen2 installed with the bench extra (pip install -e .[bench]); vLLM is measured when it imports.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
PY="${PYTHON:-python3}"   # python3: some CUDA images have no plain `python`
if ! "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export DS_ACCELERATOR=cpu
fi
exec timeout 380 "$PY" benchmarks/gpu_check.py "$@"
