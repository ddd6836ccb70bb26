"""MLflow sink: the only module in the training code that imports mlflow.

    from ragen2_core.tracking.mlflow_sink import MlflowSink

    sink = MlflowSink(experiment="ragen2", run_name="kl0.01-seed0", tags={"ragen2.seed": "0"})
    sink.log_params({"algo.kl_coef": 0.01})
    sink.log_metrics({"rollout/success": 0.4}, step=1)
    sink.close("FINISHED")

    MlflowSink(run_id=sink.run_id)                     # resume: the same run continues
    MlflowSink(parent_run_id=sweep.run_id, ...)        # child run, nested under the parent in the UI

Everything goes through `MlflowClient` with an explicit run id, never the fluent
`mlflow.start_run` API and its process-global active run, so several sinks (Tune trials in
one worker, parent + child) can be open at once.

MLflow behaviour this module relies on or works around:
- Params are immutable: re-logging the same value is accepted, a different value raises.
  On resume we skip keys already stored with the same value and warn about changed ones.
- Param values are limited to 6000 characters (tags 8000); longer values are cut here, with a
  visible marker, rather than by MLflow's own warning-and-truncate path.
- Batches carry at most 100 params/tags and 1000 metrics.
- NaN metrics are stored as NaN; +-inf are stored as +-1.797e308 (float max) by the SQL store.
- `get_metric_history` is ordered by timestamp, not step: after a resume that re-runs steps,
  readers should keep the latest-timestamped value per step.
- Metric names may contain "/" ("rollout/success") but must not start with "/" or contain "..".
"""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Optional

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from .sinks import SinkContext, check_status

log = logging.getLogger(__name__)

MAX_PARAM_CHARS = 6000
MAX_TAG_CHARS = 8000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
PARENT_TAG = "mlflow.parentRunId"
_CUT = "...[truncated]"


def search_all_runs(client, experiment_id: str, where: str = "") -> list:
    """Every run of an experiment matching the filter string, across all result pages."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=where, max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


def default_artifact_location(uri: str, experiment: str) -> Optional[str]:
    """`<db dir>/mlruns/<experiment>` for a sqlite file store, else None (the server decides).

    MLflow's own default is `./mlruns` relative to whichever cwd created the experiment, which
    scatters artifacts when runs start from different directories.
    """
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///"):].split("?", 1)[0])
    if not db.name or db.name == ":memory:":
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment).strip("._") or "experiment"
    return str(db.resolve().parent / "mlruns" / safe)


def _clip(value: object, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - len(_CUT)] + _CUT


def chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def ensure_experiment(client: MlflowClient, name: str, artifact_location: Optional[str] = None) -> str:
    """Id of experiment `name`, created if missing; safe when several processes race to create it."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            exp = client.get_experiment_by_name(name)  # another process won the race
            if exp is None:
                raise
    if exp.lifecycle_stage != "active":
        raise ValueError(f"MLflow experiment {name!r} (id {exp.experiment_id}) is deleted; restore it with "
                         f"`mlflow experiments restore --experiment-id {exp.experiment_id}` or set tracking.experiment")
    return exp.experiment_id


class MlflowSink(SinkContext):
    """One MLflow run. See the module docstring for the MLflow rules it follows.

    `run_id` resumes that run (status back to RUNNING; `experiment` and `run_name` are then
    ignored). `parent_run_id` nests this run under another. `tracking_uri` defaults to
    $MLFLOW_TRACKING_URI, else `sqlite:///<cwd>/mlflow.db`.
    """

    def __init__(self, tracking_uri: Optional[str] = None, experiment: str = "ragen2",
                 run_name: Optional[str] = None, run_id: Optional[str] = None,
                 parent_run_id: Optional[str] = None, tags: Optional[dict[str, str]] = None,
                 artifact_location: Optional[str] = None):
        self._uri = tracking_uri or default_tracking_uri()
        self._client = MlflowClient(tracking_uri=self._uri)
        self._closed = False
        extra = dict(tags or {})
        if parent_run_id:
            extra[PARENT_TAG] = parent_run_id
        if run_id:
            run = self._resume(run_id)
            self.set_tags(extra)
        else:
            location = artifact_location or default_artifact_location(self._uri, experiment)
            exp_id = ensure_experiment(self._client, experiment, location)
            run = self._client.create_run(exp_id, run_name=run_name,
                                          tags={k: _clip(v, MAX_TAG_CHARS) for k, v in extra.items()})
        self._run_id = run.info.run_id
        self._experiment_id = run.info.experiment_id
        self._params: dict[str, str] = dict(run.data.params)  # what MLflow already holds, for resume

    def _resume(self, run_id: str):
        try:
            run = self._client.get_run(run_id)
        except MlflowException as e:
            raise ValueError(f"cannot resume MLflow run {run_id!r} at {self._uri}: {e.message}; "
                             "check tracking.uri or drop the run id to start a new run") from None
        if run.info.lifecycle_stage != "active":
            raise ValueError(f"cannot resume MLflow run {run_id!r}: it is deleted; restore it in the UI or start a new run")
        self._client.update_run(run_id, status="RUNNING")
        return run

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def experiment_id(self) -> str:
        return self._experiment_id

    @property
    def tracking_uri(self) -> str:
        return self._uri

    def log_params(self, params):
        new = []
        for key, value in params.items():
            text = _clip(value, MAX_PARAM_CHARS)
            old = self._params.get(key)
            if old is None:
                new.append(Param(key, text))
            elif old != text:
                log.warning("MLflow param %r already logged as %r; keeping it and ignoring new value %r "
                            "(params are immutable)", key, _clip(old, 80), _clip(text, 80))
        for chunk in chunks(new, PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, params=chunk)
            self._params.update((p.key, p.value) for p in chunk)

    def log_metrics(self, metrics, step):
        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, int(step)) for key, value in metrics.items()]
        for chunk in chunks(batch, METRICS_PER_BATCH):
            self._client.log_batch(self._run_id, metrics=chunk)

    def log_artifact(self, path, artifact_path=None):
        path = Path(path)
        if path.is_dir():
            self._client.log_artifacts(self._run_id, str(path), artifact_path)
        else:
            self._client.log_artifact(self._run_id, str(path), artifact_path)

    def log_text(self, text, artifact_file):
        self._client.log_text(self._run_id, text, artifact_file)

    def set_tags(self, tags):
        batch = [RunTag(key, _clip(value, MAX_TAG_CHARS)) for key, value in tags.items()]
        for chunk in chunks(batch, PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, tags=chunk)

    def close(self, status="FINISHED"):
        check_status(status)
        if not self._closed:
            self._client.set_terminated(self._run_id, status)
            self._closed = True
