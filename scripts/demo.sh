#!/usr/bin/env bash
# One command from a fresh machine to the demo: install, locate the embedded policy (shipped in
# ragen2_core/policy/shipped/; without it, built once and cached under ~/.cache/ragen2, about 18
# minutes on 2 cores), evaluate it next to a random-action policy, then run the smoke sweep (2 arms x
# 2 seeds on Ray Tune, recorded in MLflow) and build its comparative PDF report. Ends by printing
# where the MLflow runs and the PDF are.
# Usage: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
ragen2 warmstart --config sweeps/base/frozenlake_tiny.yaml
ragen2 eval --config sweeps/base/frozenlake_tiny.yaml --show 1
# Each run of the demo is a new instance of the sweep; the report shows the latest.
python sweeps/run.py ablations/smoke.yaml --progress-every 20
echo
echo "MLflow store: $(pwd)/mlflow.db   (browse: mlflow ui --backend-store-uri sqlite:///$(pwd)/mlflow.db)"
echo "Report PDF:   $(pwd)/reports/out/smoke.pdf"
