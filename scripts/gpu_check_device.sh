#!/usr/bin/env bash
# scripts/gpu_check.sh on a CUDA machine with no network, in one command:
#   1. prints nvidia-smi and the versions that matter;
#   2. installs the wheels in .whl/ if that folder exists (packages the machine lacks, e.g. deepspeed,
#      trl, datasets, gymnasium; pip download them elsewhere for its python) into a scratch folder;
#   3. builds DeepSpeed's FusedAdam op once (a JIT build, about a minute on an H200) so the build does not
#      count against gpu_check.sh's 380 s limit (90 s at most here); if it does not build, our trainer falls back to torch's AdamW
#      (train.deepspeed_config with torch_adam) and the JSON says so under "overrides";
#   4. runs scripts/gpu_check.sh with the given arguments.
# The log goes to $OUT/gpu_check.log and the last JSON line to $OUT/gpu_check.json
# (OUT defaults to reports/out/gpu_check).
# Usage: bash scripts/gpu_check_device.sh [gpu_check.py arguments, e.g. --dry]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-reports/out/gpu_check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
export PYTHON="$PY"

main() {
  date -u
  nvidia-smi || echo "(no nvidia-smi)"
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  if compgen -G ".whl/*.whl" >/dev/null; then
    local site="${RAGEN2_SITE:-/tmp/ragen2-site}"
    echo "== installing $(ls .whl/*.whl | wc -l) carried wheels into $site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
      || { echo "gpu_check_device: installing .whl/*.whl failed"; return 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$PY" - <<'EOF'
import importlib.metadata as md, platform, shutil, torch
print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "| nvcc", shutil.which("nvcc"))
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"
names = ["transformers", "accelerate", "deepspeed", "trl", "datasets", "peft", "gymnasium", "pydantic",
         "huggingface-hub", "pyarrow", "fsspec", "tokenizers", "numpy", "vllm"]
print(" ".join(f"{n}={version(n)}" for n in names))
EOF
  local extra=()
  if "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    # DeepSpeed 0.19 cannot parse arch suffixes such as the "9.0a" the H200 image sets: drop them.
    local arch="${TORCH_CUDA_ARCH_LIST:-$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}"
    export TORCH_CUDA_ARCH_LIST="$(echo "$arch" | sed -E 's/([0-9]+\.[0-9]+)[a-z]+/\1/g')"
    echo "== building DeepSpeed's FusedAdam (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
    local t0=$SECONDS
    if timeout 90 "$PY" -c "from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()"; then
      echo "== FusedAdam ready after $((SECONDS - t0)) s"
    else
      echo "== FusedAdam did not build ($((SECONDS - t0)) s): our trainer uses torch's AdamW"
      local ds="${TMPDIR:-/tmp}/ragen2-ds-torch-adam.json"
      echo '{"optimizer": {"params": {"torch_adam": true}}}' >"$ds"
      extra=(--set "train.deepspeed_config=$ds")
    fi
  fi
  echo "== scripts/gpu_check.sh ${extra[*]} $*"
  bash scripts/gpu_check.sh "${extra[@]}" "$@"
}

main "$@" 2>&1 | tee "$out/gpu_check.log"
rc=${PIPESTATUS[0]}
grep '^{"name": "gpu_check"' "$out/gpu_check.log" | tail -n 1 >"$out/gpu_check.json" || true
echo "gpu_check_device: exit $rc; log $out/gpu_check.log, result $out/gpu_check.json"
exit "$rc"
