#!/usr/bin/env bash
# The sweeps of the mechanism study (docs/reproduction.md Part 3, "The study in shaped doors"), run
# or continued in order, each archived to docs/data/mechanism/ the moment it finishes. Rerun it after
# an interruption: an archived sweep is skipped, a started one goes on from its checkpoints
# (--resume), the rest start fresh. The study takes about 20 hours on 2 cores.
#
#   bash scripts/mechanism_study.sh                                      # all five, in this order
#   bash scripts/mechanism_study.sh shaped_regularisers shaped_annealing # some
#
# Exit status: 0 every named sweep archived; otherwise the failing sweep's (130 interrupted).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
sweeps=("$@")
[ ${#sweeps[@]} -gt 0 ] || sweeps=(shaped_vs_filter shaped_regularisers shaped_annealing shaped_vs_filter_ppo shaped_noise)

for s in "${sweeps[@]}"; do  # every name checked before anything starts
  [ -f "ablations/mechanism/$s.yaml" ] || {
    echo "[study] no sweep '$s' (ablations/mechanism/$s.yaml does not exist)" >&2; exit 2; }
done

for s in "${sweeps[@]}"; do
  spec=ablations/mechanism/$s.yaml
  archive=docs/data/mechanism/$s.json.gz
  if [ -f "$archive" ]; then echo "[study] $s: archived in $archive, skipped"; continue; fi
  # started = an instance folder exists under the spec's storage (the driver makes it as it starts)
  started=$("$PY" -c 'import sys; from ragen2_core.sweep.instances import known_instances
from ragen2_core.sweep.spec import read_spec
print(int(bool(known_instances(read_spec(sys.argv[1]), []))))' "$spec")
  if [ "$started" = 1 ]; then
    echo "[study] $s: resuming its latest instance"
    "$PY" sweeps/run.py "$spec" --resume
  else
    echo "[study] $s: starting"
    "$PY" sweeps/run.py "$spec"
  fi
  "$PY" reports/archive.py "$s" --out docs/data/mechanism
  echo "[study] $s: archived in $archive"
done
