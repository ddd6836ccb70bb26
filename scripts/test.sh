#!/usr/bin/env bash
# Sets up (if needed) and runs the default test tier.
# Usage: bash scripts/test.sh [extra pytest args]      (slow tier: bash scripts/test.sh -m slow)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python3 -m pytest "$@"
