"""MLflow layout of a sweep, written from the driver only: one parent run, one child run per trial.

    tracker = SweepTracker(uri, experiment, parent_run_id, spec, trials)
    Tuner(..., run_config=RunConfig(callbacks=[tracker]))

Why a Tune `Callback` of our own rather than Ray's `MLflowLoggerCallback`: that one keeps no state,
so a restored sweep opens a second run for every resumed trial and leaves the first RUNNING. Here
a trial's run is found again by its `ragen2.trial_id` tag (Tune's own trial id changes when an
errored trial is restarted), and the highest step already logged is kept in the run's
`ragen2.last_step` tag, so steps a resumed trial re-reports are not logged twice.

Who writes what: the tracker tags each child run with what only the sweep knows (role, sweep,
instance, trial id, arm, group, output folder); everything the trainer logs of its own run (its
params, its tags, config.yaml) it hands its `TuneSink`, which leaves it in the trial's sidecar
folder, and the tracker copies it to the run as soon as it appears, the same as in `ragen2 train`.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from ragen2_core.tracking.mlflow_sink import search_all_runs
from ragen2_core.sweep.spec import SweepSpec
from ragen2_core.sweep.trials import Trial, trial_dir
from ragen2_core.sweep.trainable import SIDECAR, resolve
from ragen2_core.tracking import MlflowSink, git_sha

PARENT = "mlflow.parentRunId"


def find_runs(client: MlflowClient, experiment_id: str, **tags: str) -> list:
    """Active runs of an experiment whose tags equal `tags` (keys with '.' written as '__')."""
    where = " and ".join(f"tags.`{k.replace('__', '.')}` = '{v}'" for k, v in tags.items())
    return search_all_runs(client, experiment_id, where)


class SweepTracker(Callback):
    def __init__(self, uri: str, experiment_id: str, parent_run_id: str, spec: SweepSpec, trials: dict[str, Trial]):
        self.uri, self.experiment_id, self.parent = uri, experiment_id, parent_run_id
        self.spec, self.trials = spec, trials
        self.client = MlflowClient(uri)
        self.open: dict[str, tuple[MlflowSink, Trial]] = {}  # Tune trial id -> its child run and trial
        self.run_ids: dict[str, str] = {}            # our trial id -> MLflow run id (saved with Tune's state)
        self.last_step: dict[str, int] = {}          # our trial id -> highest step logged
        self.copied: dict[Path, int] = {}            # sidecar file -> mtime when last copied to its run
        self.sha = git_sha(Path(__file__).parent)

    # ------------------------------------------------------------------ child runs

    def _open(self, trial) -> tuple[MlflowSink, Trial]:
        if trial.trial_id in self.open:
            return self.open[trial.trial_id]
        t = resolve(self.spec, self.trials, trial.config)
        old = self._remembered(self.run_ids.get(t.trial_id)) or \
            find_runs(self.client, self.experiment_id, mlflow__parentRunId=self.parent, ragen2__trial_id=t.trial_id)
        if old:
            sink = MlflowSink(tracking_uri=self.uri, run_id=old[0].info.run_id)
            self.last_step[t.trial_id] = int(old[0].data.tags.get("ragen2.last_step", 0))
        else:
            tags = {"ragen2.role": "trial", "ragen2.sweep": self.spec.name, "ragen2.instance": self.spec.instance,
                    "ragen2.trial_id": t.trial_id, "ragen2.arm": t.arm, "ragen2.group": t.group,
                    "ragen2.output_dir": str(trial_dir(self.spec, t))}
            sink = MlflowSink(tracking_uri=self.uri, experiment=self.spec.experiment, run_name=t.label,
                              parent_run_id=self.parent, tags=tags)
            self.last_step[t.trial_id] = 0
        self.run_ids[t.trial_id] = sink.run_id
        self.open[trial.trial_id] = (sink, t)
        return sink, t

    def _remembered(self, run_id: Optional[str]) -> list:
        """The run Tune's saved state names for a trial, when this store holds it under this sweep
        run. A folder resumed against another store (moved, or restored from an archive) names runs
        that are not here; the trial's run is then looked up by its tag instead."""
        if not run_id:
            return []
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return []
        return [run] if run.data.tags.get(PARENT) == self.parent else []

    def on_trial_start(self, iteration, trials, trial, **info):
        self._open(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        sink, t = self._open(trial)
        self._copy_record(sink, trial_dir(self.spec, t))
        tid, step = t.trial_id, result.get("step")
        if step is None or step <= self.last_step.get(tid, 0):
            return  # a resumed trial replays steps after its last checkpoint; they are already logged
        # Trainer metrics are namespaced ("rollout/success"); Tune's own keys and ours are not.
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, int(step))
                   for k, v in result.items() if "/" in k and isinstance(v, (int, float)) and not isinstance(v, bool)]
        self.client.log_batch(sink.run_id, metrics=metrics, tags=[RunTag("ragen2.last_step", str(step))])
        self.last_step[tid] = step

    def _finish(self, trial, status: str, error: Optional[str] = None) -> None:
        sink, t = self._open(trial)
        out = trial_dir(self.spec, t)
        self._copy_record(sink, out)
        self._upload_artifacts(sink, out)
        result = out / "result.json"
        reason = json.loads(result.read_text()).get("stop_reason", "completed") if result.exists() else \
            ("failed" if error else "stopped by the sweep (scheduler or stopper)")
        sink.set_tags({"ragen2.stop_reason": str(reason), "ragen2.failures": str(trial.num_failures)})
        if error:
            sink.log_text(error, "error.txt")
        sink.close(status)
        self.open.pop(trial.trial_id, None)

    def _copy_record(self, sink: MlflowSink, out: Path) -> None:
        """The trainer's params, tags and texts, from the trial's folder (on a cluster: shared storage),
        each file copied again only when it changed. Params are immutable in MLflow, and MlflowSink
        skips those the run already holds, so a resumed sweep may copy them again."""
        side = out / SIDECAR
        for path in [side / "params.json", side / "tags.json", *sorted((side / "texts").rglob("*"))]:
            if not path.is_file():
                continue
            stamp = path.stat().st_mtime_ns
            if self.copied.get(path) == stamp:
                continue
            if path.name == "params.json":
                sink.log_params(json.loads(path.read_text()))
            elif path.name == "tags.json":
                tags = json.loads(path.read_text())
                # A worker whose copy of the code is no git checkout (a cluster's runtime_env) cannot
                # tell its commit; the driver's is then the best record.
                if tags.get("ragen2.git_sha") == "unknown" and self.sha:
                    tags["ragen2.git_sha"] = self.sha
                sink.set_tags(tags)
            else:
                sink.log_text(path.read_text(), str(path.relative_to(side / "texts")))
            self.copied[path] = stamp

    def _upload_artifacts(self, sink: MlflowSink, out: Path) -> None:
        side = out / SIDECAR
        if (side / "artifacts.jsonl").exists():
            for line in (side / "artifacts.jsonl").read_text().splitlines():
                item = json.loads(line)
                if Path(item["path"]).exists():
                    sink.log_artifact(item["path"], item["artifact_path"])

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finish(trial, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        text = Path(trial.error_file).read_text() if trial.error_file and Path(trial.error_file).exists() else \
            "the trial failed; Tune recorded no error file"
        self._finish(trial, "FAILED", text)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._open(trial)[0].set_tags({"ragen2.failures": str(trial.num_failures)})

    def close_open(self, status: str = "KILLED") -> None:
        """Runs of trials cut off by an interrupted sweep; --resume reopens them (status RUNNING again)."""
        for sink, _ in self.open.values():
            sink.close(status)
        self.open.clear()

    # ------------------------------------------------------------------ Tune persists this with its experiment state

    def get_state(self) -> Optional[dict]:
        return {"run_ids": dict(self.run_ids)}

    def set_state(self, state: dict) -> None:
        self.run_ids.update(state.get("run_ids", {}))
