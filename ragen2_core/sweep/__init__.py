"""Sweeps: a declarative spec expanded into trials, run on Ray Tune, recorded as MLflow parent/child runs.

    spec.py       schema and validation of the spec
    trials.py     expansion, trial ids, validation of every trial config
    trainable.py  the Tune function trainable, its sink, the collapse stopper
    tracker.py    MLflow child runs, written from the driver
    progress.py   live progress table
    driver.py     the whole run: parent run, Tuner / Tuner.restore, summary; `main` is the CLI

Entry point: `python sweeps/run.py ablations/kl_vs_filter.yaml` (see docs/sweeps.md).
"""
