#!/usr/bin/env bash
# One command from a fresh machine to the demo: install, build the embedded policy (cached under
# ~/.cache/ragen2, several minutes the first time), then evaluate it on the fixed validation seeds
# of FrozenLake and Sokoban next to a random-action policy.
# Usage: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
ragen2 warmstart --config sweeps/base/frozenlake_tiny.yaml
ragen2 eval --config sweeps/base/frozenlake_tiny.yaml --show 1
ragen2 eval --config sweeps/base/sokoban_tiny.yaml --show 1
