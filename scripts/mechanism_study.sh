#!/usr/bin/env bash
# The sweeps of the mechanism study (docs/reproduction.md Part 3, "The study in shaped doors"), run
# or continued in order, each archived to docs/data/mechanism/ the moment it finishes. Rerun it after
# an interruption: an archived sweep is skipped, a started one goes on from its checkpoints
# (--resume), the rest start fresh. The study takes about 24 hours on 2 cores.
# A sweep that stops unfinished (interrupted, or a trial failed) leaves its finished trials in
# docs/data/mechanism/in_progress/<sweep>.json.gz: commit it, and on a machine without this one's
# runs/ and mlflow.db the next run restores them (reports/restore.py) and runs only the rest.
#
#   bash scripts/mechanism_study.sh                                      # all seven, in this order
#   bash scripts/mechanism_study.sh shaped_regularisers shaped_annealing # some
#
# Exit status: 0 every named sweep archived; otherwise the failing sweep's (130 interrupted).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
sweeps=("$@")
[ ${#sweeps[@]} -gt 0 ] || sweeps=(shaped_vs_filter shaped_regularisers shaped_annealing shaped_vs_filter_ppo shaped_noise
                                  shaped_random shaped_random_ppo)

for s in "${sweeps[@]}"; do  # every name checked before anything starts
  [ -f "ablations/mechanism/$s.yaml" ] || {
    echo "[study] no sweep '$s' (ablations/mechanism/$s.yaml does not exist)" >&2; exit 2; }
done

for s in "${sweeps[@]}"; do
  spec=ablations/mechanism/$s.yaml
  archive=docs/data/mechanism/$s.json.gz
  partial=docs/data/mechanism/in_progress/$s.json.gz
  if [ -f "$archive" ]; then echo "[study] $s: archived in $archive, skipped"; continue; fi
  # started = an instance folder under the spec's storage, or a sweep run in its MLflow store
  started=$("$PY" -c 'import sys
from mlflow.tracking import MlflowClient
from ragen2_core.sweep.driver import sweep_runs
from ragen2_core.sweep.instances import known_instances
from ragen2_core.sweep.spec import read_spec
from ragen2_core.tracking.mlflow_sink import default_tracking_uri
spec = read_spec(sys.argv[1])
client = MlflowClient(spec.tracking.uri or default_tracking_uri())
print(int(bool(known_instances(spec, sweep_runs(client, spec)))))' "$spec")
  if [ "$started" = 0 ] && [ -f "$partial" ]; then
    echo "[study] $s: restoring its finished trials from $partial"
    "$PY" reports/restore.py "$partial"
    started=1
  fi
  rc=0
  if [ "$started" = 1 ]; then
    echo "[study] $s: resuming its latest instance"
    "$PY" sweeps/run.py "$spec" --resume || rc=$?
  else
    echo "[study] $s: starting"
    "$PY" sweeps/run.py "$spec" || rc=$?
  fi
  if [ "$rc" != 0 ]; then
    echo "[study] $s: stopped unfinished (exit $rc)" >&2
    if "$PY" reports/archive.py "$s" --out docs/data/mechanism/in_progress; then
      echo "[study] $s: its finished trials are kept in $partial; commit it to carry them to another machine" >&2
    fi
    exit "$rc"
  fi
  "$PY" reports/archive.py "$s" --out docs/data/mechanism
  rm -f "$partial"
  echo "[study] $s: archived in $archive"
done
