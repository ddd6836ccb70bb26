"""Sweep driver: spec -> validated trials -> instance -> MLflow parent run -> Ray Tune -> summary.

    python sweeps/run.py ablations/kl_vs_filter.yaml [--dry-run] [--resume [INSTANCE]] [--tracking-uri URI]
                         [--address ADDR] [--progress-every S] [--max-trials N] [--no-memory-check]

Each plain run starts a new instance of the sweep (its own folder and MLflow parent run); --resume
continues the latest instance, --resume INSTANCE a named one (sweep/instances.py).

Before anything is created (MLflow store or run, folders, Ray), the spec is counted (more than
--max-trials trials is refused, default 1000; --dry-run still previews it) and every trial's config
passes the training preflight (train/preflight.py: model, memory, env data, store, storage folder).

Exit status: 0 every trial finished; 1 some trial failed; 2 invalid spec, too many trials, a failed
preflight, or nothing to resume, or the spec changed since the resumed instance started (nothing
started); 130 interrupted (continue with --resume).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import statistics
import sys
from pathlib import Path

from ragen2_core.atomic import write_text_atomic
from ragen2_core.sweep.spec import SpecError, SweepSpec
from ragen2_core.sweep.instances import LATEST, TAG, known_instances, new_instance, pick
from ragen2_core.sweep.trials import (MAX_TRIALS, Trial, load_spec, preview_spec, run_order, spec_hash,
                                      sweep_preflight, too_many, trial_config, trial_dir)

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 130
PREVIEW_ROWS = 20  # trials a dry run shows of a sweep over the cap
# Every trial in a fresh worker process. Reusing a finished trial's worker saves the imports (7 s a
# trial), but its resident memory grew by 1-1.5 GB a trial and a 40-trial sweep was killed by Ray's
# memory monitor at 20 (docs/sweeps.md).
REUSE_WORKERS = False


# ----------------------------------------------------------------------------- tables

def trial_table(spec: SweepSpec, trials: list[Trial]) -> list[dict]:
    keys = list(dict.fromkeys(k for t in trials for k in t.values))   # the spec's order, as in group names
    return [{"trial_id": t.trial_id, "arm": t.arm, "seed": t.seed, **{k: t.values.get(k, "") for k in keys}}
            for t in trials]


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def to_text(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    cells = [[str(c) for c in cols]] + [[_cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else "-"  # e.g. the std of one seed: no number, not "nan"
    return str(v)


def dry_run(spec: SweepSpec, trials: list[Trial], total: int | None = None) -> str:
    """The trial table; ``total`` > len(trials) when only the first trials of a larger sweep are shown."""
    total = len(trials) if total is None else total
    what = f"{total:,} trials" if spec.search.kind != "optuna" else \
        f"{spec.search.samples} optuna trials over {', '.join(spec.search.space)} (template below)"
    more = f"... and {total - len(trials):,} more\n" if spec.search.kind != "optuna" and total > len(trials) else ""
    return f"{spec.name}: {what}; base {spec.base_path}\n{to_text(trial_table(spec, trials))}\n{more}"


# ----------------------------------------------------------------------------- summary

def summarize(client, experiment_id: str, parent_id: str, metric: str) -> tuple[list[dict], list[dict]]:
    """(per trial, per group) rows from the sweep's child runs: what MLflow holds is the record."""
    from ragen2_core.sweep.tracker import find_runs
    runs = find_runs(client, experiment_id, mlflow__parentRunId=parent_id)
    per_trial = sorted(({"trial_id": r.data.tags.get("ragen2.trial_id", "?"), "group": r.data.tags.get("ragen2.group", "?"),
                         "seed": r.data.tags.get("ragen2.seed", "?"), "status": r.info.status,
                         metric: r.data.metrics.get(metric, math.nan),
                         "stop_reason": r.data.tags.get("ragen2.stop_reason", "")} for r in runs),
                       key=lambda row: (row["group"], row["seed"]))
    groups: dict[str, list[dict]] = {}
    for row in per_trial:
        groups.setdefault(row["group"], []).append(row)
    per_group = []
    for name, rows in groups.items():
        values = [r[metric] for r in rows if r["status"] == "FINISHED" and not math.isnan(r[metric])]
        mean = statistics.fmean(values) if values else math.nan
        std = statistics.stdev(values) if len(values) > 1 else math.nan
        per_group.append({"group": name, "done": sum(r["status"] == "FINISHED" for r in rows),
                          "failed": sum(r["status"] == "FAILED" for r in rows),
                          "other": sum(r["status"] not in ("FINISHED", "FAILED") for r in rows),
                          f"{metric} mean": mean, "std": std, "n": len(values)})
    return per_trial, per_group


# ----------------------------------------------------------------------------- the run

def no_reused_workers(exp_dir: Path) -> None:
    """Make a restored instance start every trial in a fresh worker, whatever the run that began it
    chose. Tune restores its controller from the newest experiment_state-*.json, `_reuse_actors`
    included, over what the restoring run passes (ray/tune/execution/tune_controller.py,
    `__setstate__`), and has no setting for it on restore; so the saved value is rewritten."""
    states = sorted(exp_dir.glob("experiment_state-*.json"))
    if not states:
        return
    state = json.loads(states[-1].read_text())
    if state.get("runner_data", {}).get("_reuse_actors", REUSE_WORKERS) != REUSE_WORKERS:
        state["runner_data"]["_reuse_actors"] = REUSE_WORKERS
        write_text_atomic(states[-1], json.dumps(state))


def _refuse(msg: str) -> int:
    print(f"sweep: {msg}", file=sys.stderr)
    return EXIT_REFUSED


def write_report(uri: str, spec: SweepSpec, parent, out: Path) -> Path | None:
    """The comparative PDF (and its tables) of this instance, logged to the parent run. A report that
    fails to build must not cost the sweep: it is reported, and `ragen2 report` can retry it."""
    try:
        # imported here, inside the guard: a report module that fails to import (a broken install,
        # a tree edited under a running sweep) is a report failure too
        from ragen2_core.report.build import build_report
        pdf = build_report(uri, spec.experiment, out, instance=spec.instance)
    except Exception as err:  # noqa: BLE001 (any failure here is the report's, not the sweep's)
        print(f"report: not built ({type(err).__name__}: {err}); retry with ragen2 report --experiment "
              f"{spec.experiment} --instance {spec.instance} --tracking-uri {uri}", file=sys.stderr)
        return None
    for f in sorted(pdf.parent.glob(f"{pdf.stem}.*")):
        parent.log_artifact(f, "report")
    return pdf


def sweep_runs(client, spec: SweepSpec) -> list:
    """The spec's sweep runs in its MLflow experiment, one per instance this store knows."""
    from ragen2_core.sweep.tracker import find_runs

    exp = client.get_experiment_by_name(spec.experiment)
    return find_runs(client, exp.experiment_id, ragen2__role="sweep", ragen2__sweep=spec.name) if exp else []


def run_sweep(spec: SweepSpec, trials: list[Trial], *, resume: str | None = None, progress_every: float = 30.0,
              report_out: Path | None = None) -> int:
    """resume: None starts a new instance; LATEST or an instance id continues that instance."""
    import ray
    from mlflow.tracking import MlflowClient
    from ray import tune

    from ragen2_core.sweep.progress import Progress
    from ragen2_core.sweep.tracker import SweepTracker, find_runs
    from ragen2_core.sweep.trainable import OBJECTIVE, CollapseStopper, resolve, train_trial
    from ragen2_core.train.checkpoint import steps_done
    from ragen2_core.tracking import MlflowSink, git_sha
    from ragen2_core.tracking.mlflow_sink import default_tracking_uri

    uri = spec.tracking.uri or default_tracking_uri()
    client = MlflowClient(uri)
    digest = spec_hash(spec)
    parents = sweep_runs(client, spec)
    old = None
    if resume is not None:
        known = known_instances(spec, parents)
        instance = pick(known, resume)
        if instance is None:
            have = ", ".join(known) or "none"
            return _refuse(f"sweep '{spec.name}' has no instance {'to resume' if resume == LATEST else repr(resume)} "
                           f"(instances in {spec.sweep_root} or experiment '{spec.experiment}': {have}). "
                           "Start a new one without --resume, or name one of these: --resume INSTANCE.")
        spec.instance, old = instance, known[instance]
        if old and old.data.tags.get("ragen2.sweep_hash") != digest:
            return _refuse(f"the spec of sweep '{spec.name}' changed since instance {instance} started (hash "
                           f"{old.data.tags.get('ragen2.sweep_hash')} -> {digest}); a resumed instance must run "
                           "the same trials. Restore the spec, or run it without --resume: a new instance.")
    else:
        spec.instance = new_instance(spec)
    exp_dir = spec.sweep_dir
    tune_state = resume is not None and tune.Tuner.can_restore(str(exp_dir))

    # ------------------------------------------------------------ parent run (created before Ray: one writer)
    if old:
        parent = MlflowSink(tracking_uri=uri, run_id=old.info.run_id)
        print(f"sweep: resuming '{spec.name}' instance {spec.instance} (MLflow run {parent.run_id}, folder {exp_dir})")
    else:
        parent = MlflowSink(tracking_uri=uri, experiment=spec.experiment, run_name=f"{spec.name}/{spec.instance}",
                            tags={"ragen2.role": "sweep", "ragen2.sweep": spec.name, TAG: spec.instance,
                                  "ragen2.sweep_hash": digest,
                                  "ragen2.git_sha": git_sha(Path(__file__).parent) or "unknown",
                                  "ragen2.trials": str(len(trials))})
        print(f"sweep: '{spec.name}' instance {spec.instance} (MLflow run {parent.run_id}, folder {exp_dir})")
        parent.log_params({f"spec.{k}": v for k, v in flatten_spec(spec).items()})
        parent.log_text(spec.text, "spec.yaml")
        parent.log_text(to_csv(trial_table(spec, trials)), "trials.csv")
    by_id = {t.trial_id: t for t in trials}
    finished = {r.data.tags.get("ragen2.trial_id") for r in
                find_runs(client, parent.experiment_id, mlflow__parentRunId=parent.run_id) if r.info.status == "FINISHED"}

    # ------------------------------------------------------------ Ray Tune
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # eval metrics come every eval_every steps only
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0 this silences Tune: Progress reports instead
    # Ray runs its workers at niceness 15 (ray-project/ray#24928) so they never starve its own
    # daemons; here the workers are the trials, and at 15 they lose the CPU to the driver, Ray's
    # daemons and anything else on the machine (a local cluster only: `ray start` sets its own).
    os.environ.setdefault("RAY_worker_niceness", "0")
    # "local" starts a private cluster even where another `ray start` cluster runs on this machine.
    ray.init(address=spec.ray.address or "local", include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
             configure_logging=True, logging_level="warning")
    # A multi-worker trial's own process only coordinates (TorchTrainer reserves its workers), and
    # Tune does not count those workers: cap concurrency by what the cluster can hold.
    multi = spec.resources.workers > 1
    trial_res = {"cpu": 0, "memory": 2**20} if multi else {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    trainable = tune.with_resources(tune.with_parameters(train_trial, spec=spec, trials=by_id), trial_res)
    if multi:
        fit = int(ray.cluster_resources().get("CPU", 1) // (spec.resources.cpu * spec.resources.workers)) or 1
        spec.max_concurrent = min(spec.max_concurrent or fit, fit)
    steps = {t.trial_id: trial_config(spec, t).train.steps for t in trials}
    tracker = SweepTracker(uri, parent.experiment_id, parent.run_id, spec, by_id)
    total = spec.search.samples if spec.search.kind == "optuna" else len(trials)
    checkpointed = {t.trial_id: steps_done(trial_dir(spec, t)) for t in trials if t.trial_id not in finished}
    progress = Progress(spec, by_id, total=total, steps=steps, finished=finished, every_s=progress_every,
                        checkpointed=checkpointed)
    stopper = CollapseStopper(spec.stopper.metric, spec.stopper.below, spec.stopper.patience) if spec.stopper else None
    name_of = lambda trial: resolve(spec, by_id, trial.config).trial_id  # noqa: E731 (Tune wants a callable)

    if tune_state:
        tuner = tune.Tuner.restore(str(exp_dir), trainable, resume_unfinished=True, resume_errored=True)
        # The restored RunConfig holds the callbacks pickled by the first run; use this run's live ones.
        run_config = tuner._local_tuner.get_run_config()
        run_config.callbacks, run_config.stop = [tracker, progress], stopper
        no_reused_workers(exp_dir)
    else:
        todo = [t for t in run_order(spec, trials) if t.trial_id not in finished]  # no Tune state: MLflow knows
        if spec.search.kind == "optuna":
            space = {"trial": trials[0].trial_id, "sample": optuna_space(spec)}
        else:
            space = {"trial": tune.grid_search([t.trial_id for t in todo])}
        tuner = tune.Tuner(
            trainable, param_space=space,
            tune_config=tune.TuneConfig(
                metric=OBJECTIVE, mode=spec.mode, search_alg=search_alg(spec),
                scheduler=scheduler(spec), num_samples=spec.search.samples if spec.search.kind == "optuna" else 1,
                max_concurrent_trials=spec.max_concurrent or None,
                trial_name_creator=name_of, trial_dirname_creator=name_of,
                reuse_actors=REUSE_WORKERS),
            run_config=tune.RunConfig(
                name=spec.instance, storage_path=str(spec.sweep_root), stop=stopper, callbacks=[tracker, progress],
                failure_config=tune.FailureConfig(max_failures=spec.max_failures), verbose=0, log_to_file=True))
    interrupted = False
    try:
        tuner.fit()  # Tune turns Ctrl-C into a clean stop that saves its state
    except KeyboardInterrupt:
        interrupted = True
    finally:
        tracker.close_open("KILLED")
        ray.shutdown()

    # ------------------------------------------------------------ summary
    per_trial, per_group = summarize(client, parent.experiment_id, parent.run_id, spec.metric)
    interrupted = interrupted or len([r for r in per_trial if r["status"] in ("FINISHED", "FAILED")]) < total
    failed = sum(r["status"] == "FAILED" for r in per_trial)
    parent.log_text(to_csv(per_trial), "summary/trials.csv")
    parent.log_text(to_csv(per_group), "summary/groups.csv")
    parent.log_text(to_text(per_group) + "\n", "summary/groups.txt")
    parent.log_metrics({"trials_finished": sum(r["status"] == "FINISHED" for r in per_trial),
                        "trials_failed": failed}, step=0)
    print(f"\n{spec.name}: per group ({spec.metric} over seeds, finished trials)\n{to_text(per_group)}")
    if failed:
        print("\nfailed trials:\n" + to_text([r for r in per_trial if r["status"] == "FAILED"]))
    pdf = write_report(uri, spec, parent, report_out) if report_out else None
    parent.close("KILLED" if interrupted else ("FAILED" if failed else "FINISHED"))
    print(f"\nMLflow: experiment '{spec.experiment}' (id {parent.experiment_id}), sweep run {parent.run_id} "
          f"(instance {spec.instance})\n"
          f"  browse: mlflow ui --backend-store-uri {uri}   then open "
          f"http://127.0.0.1:5000/#/experiments/{parent.experiment_id}/runs")
    if pdf:
        print(f"report: {pdf}")
    if interrupted:
        print(f"sweep interrupted; continue with: python sweeps/run.py {spec.path} --resume {spec.instance}")
        return EXIT_INTERRUPTED
    return EXIT_FAILED if failed else EXIT_OK


def flatten_spec(spec: SweepSpec) -> dict:
    """The spec as MLflow params: one per axis / arm key, so runs can be filtered by them."""
    out = {"name": spec.name, "base": spec.base, "seeds": spec.seeds, "search.kind": spec.search.kind,
           "metric": spec.metric, "mode": spec.mode, "resources.cpu": spec.resources.cpu,
           "resources.gpu": spec.resources.gpu, "max_concurrent": spec.max_concurrent}
    out |= {f"fixed.{k}": v for k, v in spec.fixed.items()}
    out |= {f"axes.{k}": v for k, v in spec.axes.items()}
    out |= {f"zip.{i}.{k}": v for i, g in enumerate(spec.zip) for k, v in g.items()}
    out |= {f"arms.{n}.{k}": v for n, a in spec.arms.items() for k, v in a.items()}
    out |= {f"search.space.{k}": v for k, v in spec.search.space.items()}
    return out


def preview(path: str, max_trials: int) -> int:
    """--dry-run: the count and the trial table (every trial, each config checked), or for a spec over
    the cap its first PREVIEW_ROWS trials and the refusal a real run would get."""
    spec, shown, total = preview_spec(path, PREVIEW_ROWS)
    if total <= max_trials:
        spec, shown = load_spec(path, max_trials)
    print(dry_run(spec, shown, total), end="")
    return _refuse(too_many(spec, max_trials)) if total > max_trials else EXIT_OK


def optuna_space(spec: SweepSpec) -> dict:
    from ray import tune
    make = {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}
    return {k: (tune.choice(args) if kind == "choice" else make[kind](*args))
            for k, (kind, args) in spec.search.space.items()}


def search_alg(spec: SweepSpec):
    if spec.search.kind != "optuna":
        return None  # grid and random are expanded up front, so their trial ids are known before the run
    from ray.tune.search.optuna import OptunaSearch
    from ray.tune.search import ConcurrencyLimiter
    alg = OptunaSearch(seed=spec.search.seed)
    return ConcurrencyLimiter(alg, max_concurrent=spec.max_concurrent) if spec.max_concurrent else alg


def scheduler(spec: SweepSpec):
    if spec.scheduler is None:
        return None
    from ray.tune.schedulers import ASHAScheduler
    s = spec.scheduler
    return ASHAScheduler(time_attr="step", max_t=s.max_t, grace_period=s.grace_period,
                         reduction_factor=s.reduction_factor)


# ----------------------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python sweeps/run.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="sweep spec YAML, e.g. ablations/kl_vs_filter.yaml")
    parser.add_argument("--dry-run", action="store_true", help="print the expanded trial table and exit")
    parser.add_argument("--resume", nargs="?", const=LATEST, metavar="INSTANCE",
                        help="continue the latest instance of the sweep, or the named one (default: start a new instance)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: spec, $MLFLOW_TRACKING_URI, ./mlflow.db)")
    parser.add_argument("--address", help="join an existing Ray cluster, e.g. auto or ray://head:10001")
    parser.add_argument("--progress-every", type=float, default=30.0, metavar="S",
                        help="seconds between progress tables (default 30)")
    parser.add_argument("--report-out", metavar="PDF", help="report path (default reports/out/<name>.pdf)")
    parser.add_argument("--no-report", action="store_true", help="skip the PDF report at the end")
    parser.add_argument("--max-trials", type=int, default=MAX_TRIALS, metavar="N",
                        help=f"refuse a spec that expands to more trials than this (default {MAX_TRIALS})")
    parser.add_argument("--no-memory-check", action="store_true",
                        help="start trials whose batch's estimated memory exceeds this machine's (train/preflight.py)")
    args = parser.parse_args(argv)
    try:
        if args.dry_run:
            return preview(args.spec, args.max_trials)
        spec, trials = load_spec(args.spec, args.max_trials)
    except SpecError as err:
        print(f"sweep: invalid spec:\n{err}", file=sys.stderr)
        return EXIT_REFUSED
    spec.tracking.uri = args.tracking_uri or spec.tracking.uri
    spec.ray.address = args.address or spec.ray.address
    problems = sweep_preflight(spec, trials, memory_check=not args.no_memory_check)
    if problems:
        return _refuse("cannot start:\n" + "\n".join(f"  - {p}" for p in problems))
    report_out = None if args.no_report else Path(args.report_out or f"reports/out/{spec.name}.pdf")
    return run_sweep(spec, trials, resume=args.resume, progress_every=args.progress_every, report_out=report_out)
