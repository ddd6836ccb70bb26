"""Run a sweep spec on Ray Tune, recorded in MLflow.

    python sweeps/run.py ablations/kl_vs_filter.yaml --dry-run     # expanded trial table, nothing runs
    python sweeps/run.py ablations/kl_vs_filter.yaml               # run it (MLflow store: ./mlflow.db)
    python sweeps/run.py ablations/kl_vs_filter.yaml --resume      # continue after an interruption
    python sweeps/run.py ablations/kl_vs_filter.yaml --address auto --tracking-uri http://mlflow:5000

Spec reference, MLflow layout and cluster setup: docs/sweeps.md.
"""
import sys

from ragen2_core.sweep.driver import main

if __name__ == "__main__":
    sys.exit(main())
