"""Read one sweep from MLflow into plain records (MlflowClient only; nothing is written).

    from ragen2_core.report.collect import collect, UnknownExperiment

    sweep = collect("sqlite:///mlflow.db", "kl_vs_filter")            # its latest instance
    sweep = collect(uri, "kl_vs_filter", instance="2026-12-03_20-05-11")  # a named one
    for t in sweep.trials:
        t.arm, t.condition, t.seed, t.status, t.final("eval/success"), t.curve("collapse/mi")
    sweep.expected    # every planned trial (the parent's trials.csv), started or not
    sweep.notes       # what was missing or odd, in words, for the report's title page

The layout read is the sweep driver's (ragen2_core/sweep/driver.py, tracker.py): a parent run
tagged `ragen2.role=sweep` with `spec.yaml` and `trials.csv`; one child run per trial with tags
`ragen2.trial_id / arm / group / seed / config_hash / stop_reason`, the flattened config as params
and metrics by step. Older or failed trials may lack any of it; what is missing is recorded in
`notes` and `Trial.missing`, never raised.
"""
from __future__ import annotations

import csv
import re
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ragen2_core.tracking.mlflow_sink import search_all_runs

METRICS = ("eval/success", "rollout/success", "collapse/mi", "collapse/mi_zscore", "collapse/mi_zscore_ema", "collapse/mi_perm_zscore",
           "collapse/mi_perm_zscore_ema", "actor/entropy",
           "filter/kept_ratio", "filter/kept_groups", "filter/kept_group_reward_std",
           "filter/dropped_group_reward_std", "filter/dropped_group_reward_std_max",
           "rollout/think_tokens", "rollout/template_frac", "eval/template_frac",
           "eval/success_grounded", "eval/success_template", "actor/reg_to_task_grad_ratio",
           "rollout/frac_zero_std_groups", "cost/cum_rollout_tokens", "cost/cum_wall_s")
# Kept when a run logged them, never noted as missing: the gradient probe runs only where
# `grad_probe.every` is set, and these are what a study reads to explain a failed or odd run.
OPTIONAL_METRICS = ("rollout/format_valid", "actor/grad_norm", "actor/grad_norm_task",
                    "grad_probe/b0/grad_norm_task", "grad_probe/b1/grad_norm_task",
                    "grad_probe/b0/group_reward_std", "grad_probe/b1/group_reward_std")
PARENT = "mlflow.parentRunId"
INSTANCE = "ragen2.instance"  # sweep/instances.py
NOT_AXES = {"train.seed", "train.output_dir", "train.resume", "train.threads"}


class UnknownExperiment(LookupError):
    pass


@dataclass
class Trial:
    run_id: str
    trial_id: str
    arm: str
    condition: str
    seed: str
    status: str
    stop_reason: str
    params: dict
    tags: dict
    start_ms: Optional[int]
    end_ms: Optional[int]
    history: dict = field(default_factory=dict)   # metric -> (steps, values), one value per step
    missing: list = field(default_factory=list)   # metrics of METRICS this run never logged

    def curve(self, metric: str) -> tuple[list[int], list[float]]:
        return self.history.get(metric, ([], []))

    def final(self, metric: str) -> Optional[float]:
        """Value at the last step this metric was logged (None when never logged)."""
        steps, values = self.curve(metric)
        return values[-1] if values else None

    def last_step(self) -> Optional[int]:
        steps = [s[-1] for s, _ in self.history.values() if s]
        return max(steps) if steps else None


@dataclass
class Sweep:
    tracking_uri: str
    experiment: str
    experiment_id: str
    parent: Optional[dict]            # run_id, tags, status, start_ms, end_ms of the sweep run
    spec_text: str
    spec: dict
    trials: list[Trial]
    expected: list[dict]              # trial_id, arm, condition, seed of every planned trial
    axes: list[str]                   # numeric or categorical keys the sweep varied (besides arms)
    notes: list[str] = field(default_factory=list)
    samples: Optional[dict] = None    # run_id -> eval_samples(); held only by a sweep read from an archive

    def __post_init__(self):
        # Older sweeps' trials.csv lists a planned trial's keys sorted, while the trials' group names
        # keep the spec's order (a zip of kl_coef and entropy_coef): one condition, two spellings.
        # The trials' spelling wins.
        spelled = {frozenset(t.condition.split()): t.condition for t in self.trials}
        self.expected = [{**e, "condition": spelled.get(frozenset(e["condition"].split()), e["condition"])}
                         for e in self.expected]

    @property
    def arms(self) -> list[str]:
        return _ordered([e["arm"] for e in self.expected] + [t.arm for t in self.trials])

    @property
    def conditions(self) -> list[str]:
        return _ordered([e["condition"] for e in self.expected] + [t.condition for t in self.trials])

    def cell(self, arm: str, condition: str) -> list[Trial]:
        return [t for t in self.trials if t.arm == arm and t.condition == condition]

    def planned(self, arm: str, condition: str) -> int:
        n = sum(1 for e in self.expected if e["arm"] == arm and e["condition"] == condition)
        return max(n, len(self.cell(arm, condition)))


def _ordered(items) -> list:
    return list(dict.fromkeys(items))


# ----------------------------------------------------------------------------- helpers

def short(v) -> str:
    """A value as the sweep writes it into a trial's group name (spec.Trial.group)."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def parse_value(text: str):
    """A param or CSV cell back to int / float / bool where it reads as one."""
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    for cast in (int, float):
        try:
            return cast(text)
        except (TypeError, ValueError):
            pass
    return text


def condition_of(arm: str, group: str) -> str:
    """The group name without its arm: the settings the arms are compared under."""
    rest = group[len(arm):].strip() if group.startswith(arm) else group
    return rest or "all"


def dedupe(history) -> tuple[list[int], list[float]]:
    """One value per step. A resumed trial can re-report a step; the last write wins
    (latest timestamp; MLflow's order breaks ties)."""
    by_step: dict[int, tuple[int, int, float]] = {}
    for order, m in enumerate(history):
        key = (m.timestamp, order)
        if m.step not in by_step or key >= by_step[m.step][:2]:
            by_step[m.step] = (m.timestamp, order, m.value)
    steps = sorted(by_step)
    return steps, [by_step[s][2] for s in steps]


def _text_artifact(client: MlflowClient, run_id: str, path: str) -> Optional[str]:
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return Path(client.download_artifacts(run_id, path, tmp)).read_text()
    except (MlflowException, OSError):
        return None


def experiment_names(client: MlflowClient) -> list[str]:
    names, token = [], None
    while True:
        page = client.search_experiments(max_results=1000, page_token=token)
        names += [e.name for e in page]
        token = page.token
        if not token:
            return sorted(names)


# ----------------------------------------------------------------------------- the sweep

def collect(tracking_uri: str, experiment: str, metrics=METRICS, instance: Optional[str] = None,
            optional=OPTIONAL_METRICS) -> Sweep:
    """The sweep's latest instance (latest parent run), or the one named by ``instance``."""
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = experiment_names(client)
        found = ", ".join(names) if names else "none"
        raise UnknownExperiment(f"no MLflow experiment named {experiment!r} at {tracking_uri}; experiments "
                                f"there: {found}. Pass one of them with --experiment, or the store the sweep "
                                "wrote to with --tracking-uri.")
    if exp.lifecycle_stage != "active":
        raise UnknownExperiment(f"MLflow experiment {experiment!r} (id {exp.experiment_id}) at {tracking_uri} is "
                                f"deleted; restore it with `mlflow experiments restore --experiment-id "
                                f"{exp.experiment_id}` or pick another: {', '.join(experiment_names(client))}")
    notes: list[str] = []
    runs = search_all_runs(client, exp.experiment_id)
    if not runs:
        raise UnknownExperiment(f"MLflow experiment {experiment!r} at {tracking_uri} has no runs, so there is "
                                "nothing to report; run the sweep first, or pick another experiment: "
                                f"{', '.join(experiment_names(client))}")
    parents = [r for r in runs if r.data.tags.get("ragen2.role") == "sweep"]
    if instance is not None:
        named = [r for r in parents if r.data.tags.get(INSTANCE) == instance]
        if not named:
            have = ", ".join(sorted({r.data.tags[INSTANCE] for r in parents if r.data.tags.get(INSTANCE)})) or "none"
            raise UnknownExperiment(f"experiment {experiment!r} at {tracking_uri} has no sweep instance {instance!r}; "
                                    f"its instances: {have}. Leave --instance out for the latest.")
        parents = named
    parent = max(parents, key=lambda r: r.info.start_time or 0) if parents else None
    if len(parents) > 1 and instance is None:
        notes.append(f"{len(parents)} sweep instances in this experiment; reporting the latest, "
                     f"{parent.data.tags.get(INSTANCE) or parent.info.run_id} (name another with --instance).")
    if parent is None:
        notes.append("no sweep run (tag ragen2.role=sweep) in this experiment: every run is treated as a trial.")
        children = [r for r in runs if r.data.tags.get("ragen2.role") != "sweep"]
    else:
        children = [r for r in runs if r.data.tags.get(PARENT) == parent.info.run_id]

    spec_text = (_text_artifact(client, parent.info.run_id, "spec.yaml") if parent else None) or ""
    try:
        spec = yaml.safe_load(spec_text) or {} if spec_text else {}
    except yaml.YAMLError:
        spec = {}
    if parent and not spec_text:
        notes.append("the sweep run has no spec.yaml artifact: question and axes are inferred from the runs.")

    trials = [_trial(client, r, metrics, optional) for r in children]
    expected = _expected(client, parent, notes) if parent else []
    axes = _axes(spec, trials)
    lacking = sorted({m for t in trials for m in t.missing})
    for m in lacking:
        who = [t for t in trials if m in t.missing]
        notes.append(f"{m}: not logged by {len(who)} of {len(trials)} trials (e.g. {who[0].trial_id}).")
    pdict = None
    if parent:
        pdict = {"run_id": parent.info.run_id, "tags": dict(parent.data.tags), "status": parent.info.status,
                 "start_ms": parent.info.start_time, "end_ms": parent.info.end_time}
    return Sweep(tracking_uri, experiment, exp.experiment_id, pdict, spec_text, spec if isinstance(spec, dict) else {},
                 trials, expected, axes, notes)


def _trial(client: MlflowClient, run, metrics, optional=()) -> Trial:
    tags = dict(run.data.tags)
    tid = tags.get("ragen2.trial_id") or run.info.run_name or run.info.run_id
    arm = tags.get("ragen2.arm") or "run"
    group = tags.get("ragen2.group") or arm
    t = Trial(run_id=run.info.run_id, trial_id=tid, arm=arm, condition=condition_of(arm, group),
              seed=tags.get("ragen2.seed") or run.data.params.get("train.seed", "?"), status=run.info.status,
              stop_reason=tags.get("ragen2.stop_reason", ""), params=dict(run.data.params), tags=tags,
              start_ms=run.info.start_time, end_ms=run.info.end_time)
    for m in (*metrics, *optional):
        if m in run.data.metrics:
            t.history[m] = dedupe(client.get_metric_history(run.info.run_id, m))
        elif m in metrics:
            t.missing.append(m)
    return t


def _expected(client: MlflowClient, parent, notes: list[str]) -> list[dict]:
    """Every planned trial from the parent's trials.csv, so trials never started still count."""
    text = _text_artifact(client, parent.info.run_id, "trials.csv")
    if not text:
        notes.append("the sweep run has no trials.csv: trials that never started cannot be counted.")
        return []
    rows = list(csv.DictReader(io.StringIO(text)))
    out = []
    for row in rows:
        arm = row.get("arm", "base")
        values = [f"{k}={short(parse_value(v))}" for k, v in row.items()
                  if k not in ("trial_id", "arm", "seed") and v != ""]
        out.append({"trial_id": row.get("trial_id", "?"), "arm": arm, "seed": row.get("seed", "?"),
                    "condition": " ".join(values) or "all"})
    return out


def _axes(spec: dict, trials: list[Trial]) -> list[str]:
    """Keys the sweep varied besides the arm: from the spec, else from the group names."""
    keys = list(spec.get("axes") or {})
    for group in spec.get("zip") or []:
        keys += list(group or {})
    keys += list(((spec.get("search") or {}).get("space")) or {})
    if not keys:
        keys = [part.split("=", 1)[0] for t in trials for part in t.condition.split() if "=" in part]
    return [k for k in _ordered(keys) if k not in NOT_AXES]


def axis_value(trial: Trial, key: str):
    """The trial's value of an axis: its param, else the `key=value` in its condition."""
    if key in trial.params:
        return parse_value(trial.params[key])
    for part in trial.condition.split():
        k, _, v = part.partition("=")
        if k == key:
            return parse_value(v)
    return None


def eval_samples(sweep: Sweep, trial: Trial) -> dict[int, str]:
    """step -> text of `samples/eval_stepNNNNNN.txt` for one trial (empty when none were logged)."""
    if sweep.samples is not None:  # read from an archive (report/archive.py)
        return dict(sorted(sweep.samples.get(trial.run_id, {}).items()))
    client = MlflowClient(sweep.tracking_uri)
    try:
        files = [a.path for a in client.list_artifacts(trial.run_id, "samples") if not a.is_dir]
    except (MlflowException, OSError):
        return {}
    out = {}
    for path in files:
        name = Path(path).stem
        if name.startswith("eval_step") and name[len("eval_step"):].isdigit():
            text = _text_artifact(client, trial.run_id, path)
            if text is not None:
                out[int(name[len("eval_step"):])] = text
    return dict(sorted(out.items()))


EPISODE = re.compile(r"^=== seed (\S+) success (\S+) reward (\S+)$", re.M)
FIRST_THINK = re.compile(r"\n<think>(.*?)(?:</think>|\nReward: |\Z)", re.S)


def first_thinks(text: str) -> dict[str, dict]:
    """validation seed -> {think, success} from a samples file: the first turn's reasoning, i.e. the
    text after the prompt's closing `<think>` (generation starts there) up to `</think>`."""
    heads = list(EPISODE.finditer(text))
    out = {}
    for i, h in enumerate(heads):
        body = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        m = FIRST_THINK.search(body)
        out[h.group(1)] = {"think": m.group(1).strip() if m else "", "success": h.group(2) == "True",
                           "closed": bool(m and body[m.end() - len("</think>"):m.end()] == "</think>")}
    return out
