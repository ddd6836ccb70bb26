#!/usr/bin/env bash
# Runs the default test tier against the lowest versions setup.py declares (install_requires and the
# dev extra, each pinned to its floor), in a venv of its own: a floor is a tested claim, not a guess.
# Usage: bash scripts/floors.sh [extra pytest args]      (venv: $FLOORS_VENV, default /tmp/ragen2-floors)
# The venv sees none of this machine's packages (one installed elsewhere can break an old release:
# a newer `kernels` fails transformers 5.0's import). torch is the one floor not tested: the venv
# gets the CPU build setup.sh installs ($TORCH_SPEC, default torch==2.13.0), since PyPI's older
# torch wheels are multi-GB CUDA builds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FLOORS_VENV:-/tmp/ragen2-floors}
PINS=$(python3 - <<'EOF'
# Each requirement pinned to the lowest release at or above its floor ("pytest-timeout>=2.3" has no
# 2.3, only 2.3.1), as `pip index versions` lists them for this Python.
import ast, subprocess
from packaging.version import Version
call = next(n for n in ast.walk(ast.parse(open("setup.py").read()))
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
for req in kw["install_requires"] + kw["extras_require"]["dev"]:
    name, sep, floor = req.partition(">=")
    if not sep:
        raise SystemExit(f"setup.py: {req!r} has no '>=' floor; declare one (name>=version) to test it here")
    if name == "torch":
        continue
    out = subprocess.run(["python3", "-m", "pip", "index", "versions", name.split("[")[0]],
                         capture_output=True, text=True, check=True).stdout
    listed = next(line for line in out.splitlines() if line.startswith("Available versions:"))
    found = [Version(v) for v in listed.split(":", 1)[1].split(",")]
    print(f"{name}=={min(v for v in found if v >= Version(floor) and not v.is_prerelease)}")
EOF
)
python3 -m venv --clear "$VENV"  # nothing left from an earlier run
"$VENV/bin/python" -m pip install -q ${TORCH_PIP_ARGS:-} "${TORCH_SPEC:-torch==2.13.0}"
echo "[floors] installing into $VENV:" $PINS
"$VENV/bin/python" -m pip install -q $PINS
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -c "import torch; print('[floors] torch', torch.__version__, '(not a floor)')"
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
"$VENV/bin/python" -m pytest "$@"
