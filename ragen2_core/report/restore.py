"""An archived sweep written back into an MLflow store as the instance it was, so a sweep can go on
where its store is not: a fresh machine, another store. The inverse of report/archive.py for the
trials that finished.

    python reports/archive.py kl_vs_filter --out saved/          # on the first machine, mid-sweep
    python reports/restore.py saved/kl_vs_filter.json.gz         # on the next, into ./mlflow.db
    python sweeps/run.py ablations/kl_vs_filter.yaml --resume    # runs only the trials not finished

The sweep driver resumes an instance whose Tune state is gone from its MLflow parent run alone: a
trial with a FINISHED child run is not run again (sweep/driver.py). So restore writes the parent
run (its tags, spec.yaml and trials.csv) and one FINISHED child run per finished trial, with the
trial's tags, params, the metric curves an archive keeps (report/collect.METRICS and
OPTIONAL_METRICS) and its validation sample files. Trials that had not finished are left out, so
that --resume runs them from step 0 in runs of their own; a half-logged run would make the tracker
skip their first steps.
What an archive does not hold is not restored: other metrics, checkpoints, the policy artifacts,
the sweep run's spec.* params. It is meant for a machine without the instance's folder: where the
folder is there, --resume follows Tune's saved state, which counts a trial finished after the
archive was taken as done although the restored store lacks it.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from ragen2_core.report.collect import INSTANCE, PARENT, Sweep
from ragen2_core.tracking.mlflow_sink import (METRICS_PER_BATCH, PARAMS_PER_BATCH, chunks, default_artifact_location,
                                              ensure_experiment, search_all_runs)

RESTORED = "ragen2.restored_from"


class AlreadyThere(ValueError):
    pass


@dataclass
class Restored:
    parent_run_id: str
    instance: str
    finished: int          # trials written as FINISHED runs
    left_out: list         # trial ids of the archive's unfinished trials (--resume runs them)


def trials_csv(sweep: Sweep) -> str:
    """The parent's trials.csv rebuilt from the archive's planned trials: the columns collect reads
    (trial_id, arm, seed and each `key=value` of the condition), so the restored store lists the same
    planned trials."""
    rows = []
    for e in sweep.expected:
        parts = [p.partition("=") for p in e["condition"].split() if "=" in p]
        rows.append({"trial_id": e["trial_id"], "arm": e["arm"], "seed": e["seed"], **{k: v for k, _, v in parts}})
    keys = list(dict.fromkeys(k for r in rows for k in r))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=keys or ["trial_id", "arm", "seed"])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def restore(sweep: Sweep, tracking_uri: str, source: str) -> Restored:
    """Write ``sweep`` into the store at ``tracking_uri``; ``source`` (the archive's name) is tagged on
    the parent run. Refuses (AlreadyThere) when the store holds this instance already."""
    if not sweep.parent or not sweep.parent["tags"].get(INSTANCE):
        raise ValueError(f"{source} holds no sweep instance (no parent run tagged {INSTANCE}); only a sweep "
                         "written by sweeps/run.py can be restored and resumed.")
    instance = sweep.parent["tags"][INSTANCE]
    client = MlflowClient(tracking_uri)
    exp_id = ensure_experiment(client, sweep.experiment, default_artifact_location(tracking_uri, sweep.experiment))
    there = search_all_runs(client, exp_id, f"tags.`{INSTANCE}` = '{instance}' and tags.`ragen2.role` = 'sweep'")
    if there:
        raise AlreadyThere(f"{tracking_uri} holds sweep '{sweep.experiment}' instance {instance} already (run "
                           f"{there[0].info.run_id}); continue it with `python sweeps/run.py SPEC --resume {instance}`, "
                           "or restore into another store with --tracking-uri.")

    tags = {**sweep.parent["tags"], RESTORED: source}
    parent = client.create_run(exp_id, start_time=sweep.parent["start_ms"], tags=tags,
                               run_name=tags.get("mlflow.runName") or f"{sweep.experiment}/{instance}")
    pid = parent.info.run_id
    client.log_text(pid, sweep.spec_text, "spec.yaml")
    client.log_text(pid, trials_csv(sweep), "trials.csv")

    done = [t for t in sweep.trials if t.status == "FINISHED"]
    for t in done:
        run = client.create_run(exp_id, start_time=t.start_ms, tags={**t.tags, PARENT: pid},
                                run_name=t.tags.get("mlflow.runName") or t.trial_id)
        rid = run.info.run_id
        for chunk in chunks([Param(k, str(v)) for k, v in t.params.items()], PARAMS_PER_BATCH):
            client.log_batch(rid, params=chunk)
        stamp = t.end_ms or t.start_ms or 0
        points = [Metric(m, float(v), stamp, int(s)) for m, (steps, values) in t.history.items()
                  for s, v in zip(steps, values)]
        for chunk in chunks(points, METRICS_PER_BATCH):
            client.log_batch(rid, metrics=chunk)
        for step, text in (sweep.samples or {}).get(t.run_id, {}).items():
            client.log_text(rid, text, f"samples/eval_step{int(step):06d}.txt")
        client.set_terminated(rid, "FINISHED", end_time=t.end_ms)
    # An archive taken mid-sweep holds a RUNNING parent; here no driver runs it: KILLED, as an
    # interrupted driver leaves it, until --resume reopens it.
    status = sweep.parent["status"]
    client.set_terminated(pid, "KILLED" if status == "RUNNING" else status, end_time=sweep.parent["end_ms"])
    return Restored(pid, instance, len(done), [t.trial_id for t in sweep.trials if t.status != "FINISHED"])
