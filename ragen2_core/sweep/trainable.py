"""The Ray Tune side of a sweep: the function trainable, the sink it trains with, the collapse stopper.

    from ray import tune
    trainable = tune.with_parameters(train_trial, spec=spec, trials={t.trial_id: t for t in trials})

A trial never writes to MLflow itself: metrics go to Tune with `tune.report`, and the driver's
tracker (driver.py) writes them, so one process is the only writer of the sqlite store. Texts,
tags and artifact paths the trainer hands to its sink are written into the trial's output
folder, which the driver uploads when the trial ends.
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path

from ray import tune

from ragen2_core.atomic import write_text_atomic
from ragen2_core.sweep.spec import SweepSpec
from ragen2_core.sweep.trials import Trial, make_trial, trial_config
from ragen2_core.tracking import SinkContext

OBJECTIVE = "objective"  # latest value of spec.metric, carried forward: schedulers and searchers need it every report
SIDECAR = "sweep"        # folder inside the trial's output dir holding what the driver uploads


def resolve(spec: SweepSpec, trials: dict[str, Trial], config: dict) -> Trial:
    """The Trial behind a Tune config: `{"trial": id}` for grid/random, plus `{"sample": {...}}` for optuna."""
    trial = trials[config["trial"]]
    if config.get("sample"):
        return make_trial(spec, trial.arm, dict(config["sample"]), trial.seed)
    return trial


class TuneSink(SinkContext):
    """Trainer sink inside a Tune trial. Fails the trial on a NaN in a guarded metric.

    `report` is `tune.report` in a one-process trial, `ray.train.report` in a Ray Train worker
    (whose rank-0 reports TuneReportCallback forwards to Tune)."""

    def __init__(self, out_dir: Path, metric: str, nan_guard: list[str], report=None):
        self.dir = Path(out_dir) / SIDECAR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metric, self.nan_guard = metric, nan_guard
        self.objective = None
        self.report = report or tune.report

    def log_metrics(self, metrics, step):
        for key in self.nan_guard:
            if key in metrics and math.isnan(float(metrics[key])):
                raise FloatingPointError(f"{key} is NaN at step {step}; the trial is marked failed "
                                         "(lower algo.actor_lr or check the rewards)")
        if self.metric in metrics:
            self.objective = float(metrics[self.metric])
        report = {k: float(v) for k, v in metrics.items()} | {"step": int(step)}
        if self.objective is not None:
            report[OBJECTIVE] = self.objective
        self.report(report)

    def log_params(self, params):
        self._merge("params.json", params)

    def set_tags(self, tags):
        self._merge("tags.json", tags)

    def _merge(self, name: str, items: dict) -> None:
        path = self.dir / name
        old = json.loads(path.read_text()) if path.exists() else {}
        write_text_atomic(path, json.dumps(old | {k: str(v) for k, v in items.items()}))

    def log_text(self, text, artifact_file):
        path = self.dir / "texts" / artifact_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def log_artifact(self, path, artifact_path=None):
        with open(self.dir / "artifacts.jsonl", "a") as f:
            f.write(json.dumps({"path": str(Path(path).resolve()), "artifact_path": artifact_path}) + "\n")

    def close(self, status="FINISHED"):
        pass


class _NotATerminal:
    """A stream that also answers `isatty()`. Ray Tune's `log_to_file` replaces sys.stdout/stderr
    with a Tee that lacks it, and transformers' loading report calls it (it failed every PPO trial:
    loading the critic reports its new value head)."""

    def __init__(self, inner):
        self._inner = inner

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._inner, name)


@contextlib.contextmanager
def file_like_streams():
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None or hasattr(s, "isatty") else _NotATerminal(s) for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def train_trial(config: dict, spec: SweepSpec, trials: dict[str, Trial]) -> None:
    """Tune function trainable: one training run. A restarted trial resumes from its own checkpoints,
    because its output folder is fixed by the trial id and the sweep sets train.resume=true."""
    from ragen2_core.train.trainer import run  # heavy imports stay in the worker

    trial = resolve(spec, trials, config)
    cfg = trial_config(spec, trial)
    with file_like_streams():
        if spec.resources.workers > 1:
            return train_workers(cfg, spec, trial)
        sink = TuneSink(Path(cfg.train.output_dir), spec.metric, spec.nan_guard)
        run(cfg, sink)


def worker_loop(loop_config: dict) -> None:
    """One Ray Train worker: the trainer joins the process group TorchTrainer opened (gloo on CPU,
    nccl on GPU); every rank reports each step (Ray Train gathers them; rank 0's reach Tune)."""
    import ray.train

    from ragen2_core.train.trainer import run

    cfg = loop_config["cfg"]
    with file_like_streams():
        run(cfg, TuneSink(Path(cfg.train.output_dir), loop_config["metric"], loop_config["nan_guard"],
                          report=ray.train.report))


def train_workers(cfg, spec: SweepSpec, trial: Trial) -> None:
    """A data-parallel trial: `workers` trainer processes under TorchTrainer, inside this Tune trial.
    Its Train run is named after the trial id, so a resumed sweep finds the same run again."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    r = spec.resources
    per_worker = {"CPU": r.cpu} | ({"GPU": r.gpu} if r.gpu else {})
    TorchTrainer(worker_loop, train_loop_config={"cfg": cfg, "metric": spec.metric, "nan_guard": spec.nan_guard},
                 scaling_config=ScalingConfig(num_workers=r.workers, use_gpu=bool(r.gpu), resources_per_worker=per_worker),
                 run_config=RunConfig(name=f"train-{trial.trial_id}", storage_path=str(spec.sweep_dir / "train"),
                                      callbacks=[TuneReportCallback()])).fit()


class CollapseStopper(tune.Stopper):
    """Stops a trial once `metric` was below `below` for `patience` consecutive measurements."""

    def __init__(self, metric: str, below: float, patience: int):
        self.metric, self.below, self.patience = metric, below, patience
        self.streak: dict[str, int] = {}

    def __call__(self, trial_id, result):
        if self.metric not in result:
            return False  # measured every collapse.every steps only
        low = float(result[self.metric]) < self.below
        self.streak[trial_id] = self.streak.get(trial_id, 0) + 1 if low else 0
        return self.streak[trial_id] >= self.patience

    def stop_all(self):
        return False
