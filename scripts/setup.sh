#!/usr/bin/env bash
# Installs ragen2 and its dependencies into the current Python.
# Usage: bash scripts/setup.sh
# torch: an existing install (e.g. a CUDA build) is kept; otherwise the CPU build torch==2.13.0 is
# installed first, so no dependency can pull a multi-GB CUDA build. Override with TORCH_SPEC=...
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
echo "[setup] done"
