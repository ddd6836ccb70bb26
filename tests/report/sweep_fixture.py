"""TEST DATA for the report builder: a made-up sweep written with the real MlflowClient into a
sqlite store under tmp_path, laid out as the sweep driver lays it out (parent run + child runs).

Nothing here was trained; the numbers are chosen so the expected statistics are easy to derive:
2 arms (nofilter, filter) x 2 conditions (algo.kl_coef 0.0, 0.01) x 3 seeds.
"""
from __future__ import annotations

import csv
import io

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

EXPERIMENT = "fixture_kl_vs_filter"
SPEC = """\
# Question: does a KL penalty replace the SNR filter? (TEST DATA, not a real result)
# Run:      python sweeps/run.py ablations/fixture.yaml
name: fixture_kl_vs_filter
base: ../sweeps/base/frozenlake_tiny.yaml
axes:
  algo.kl_coef: [0.0, 0.01]
arms:
  nofilter: nofilter
  filter: paper
seeds: 3
"""
# Final eval/success per (arm, kl_coef), seeds 0, 1, 2.
FINAL = {("nofilter", 0.0): [0.2, 0.3, 0.4],      # mean 0.3
         ("nofilter", 0.01): [0.25, 0.25, 0.25],  # all seeds equal: zero-width interval, never NaN
         ("filter", 0.0): [0.5, 0.6, 0.7],        # mean 0.6: the best cell
         ("filter", 0.01): [0.4, 0.5, 0.75]}      # mean 0.55
# Last collapse/mi per cell: rises with success, so its Spearman rho with success is positive.
MI = {("nofilter", 0.0): [0.1, 0.2, 0.3], ("nofilter", 0.01): [0.15, 0.15, 0.15],
      ("filter", 0.0): [0.9, 1.0, 1.1], ("filter", 0.01): [0.7, 0.8, 0.95]}
THINK = {"early": ["Player: (0, 1). Goal: (3, 2). Next: Down.", "Player: (2, 2). Goal: (0, 0). Next: Up.",
                   "Player: (1, 3). Goal: (1, 0). Next: Left."],
         "late": ["I will move towards the goal."] * 3}


def group(arm: str, kl: float) -> str:
    return f"{arm} algo.kl_coef={kl:.4g}"


def samples(kind: str) -> str:
    eps = []
    for i, think in enumerate(THINK[kind]):
        eps.append(f"=== seed {1000 + i} success {i == 0} reward 0.90\nYou are a FrozenLake solver.\n"
                   f"You have 10 actions left. Always output: <think> ... </think> <answer> ... </answer>\n"
                   f"<think>{think}</think><answer>Down</answer>\nReward: 1")
    return "\n\n".join(eps)


def write_sweep(root, failed: tuple | None = None) -> str:
    """A sqlite store under `root` holding the fixture sweep; returns its tracking URI.
    `failed` = (arm, kl, seed) of one trial marked FAILED, whose final eval never arrived."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT, artifact_location=str(root / "mlruns"))
    parent = client.create_run(exp, run_name=EXPERIMENT, tags={
        "ragen2.role": "sweep", "ragen2.sweep": EXPERIMENT, "ragen2.sweep_hash": "fixture", "ragen2.git_sha": "abc123"})
    pid = parent.info.run_id
    client.log_text(pid, SPEC, "spec.yaml")
    table = io.StringIO()
    w = csv.writer(table)
    w.writerow(["trial_id", "arm", "seed", "algo.kl_coef"])
    ids = {}
    for (arm, kl), finals in FINAL.items():
        for seed, final in enumerate(finals):
            tid = f"{arm}-{int(kl * 100)}-{seed}"
            w.writerow([tid, arm, seed, kl])
            broken = failed == (arm, kl, seed)
            run = client.create_run(exp, run_name=f"{group(arm, kl)} seed={seed}", tags={
                "mlflow.parentRunId": pid, "ragen2.role": "trial", "ragen2.sweep": EXPERIMENT, "ragen2.trial_id": tid,
                "ragen2.arm": arm, "ragen2.group": group(arm, kl), "ragen2.seed": str(seed),
                "ragen2.config_hash": f"h{tid}", "ragen2.git_sha": "abc123", "ragen2.python": "3.11.7",
                "ragen2.stop_reason": "failed" if broken else "completed"})
            rid = run.info.run_id
            ids[(arm, kl, seed)] = rid
            client.log_batch(rid, params=[Param(k, v) for k, v in {
                "algo.kl_coef": str(kl), "train.seed": str(seed), "filter.value": "0.9" if arm == "filter" else "1.0"}.items()])
            mi = MI[(arm, kl)][seed]
            t0 = 1_700_000_000_000
            ms = [Metric("eval/success", final / 2, t0, 10),
                  Metric("eval/success", 0.0, t0 + 1, 20),          # a resumed trial re-reports step 20 ...
                  Metric("eval/success", final, t0 + 2, 20)]        # ... and the last write wins
            for step in (1, 6, 11, 16):
                ms += [Metric("collapse/mi", mi * step / 16, t0, step), Metric("collapse/mi_zscore", 10 * mi * step / 16, t0, step)]
            for step in range(1, 21):
                ms += [Metric("actor/entropy", 1.0 - final / 2, t0, step), Metric("filter/kept_ratio", 1.0 if arm == "nofilter" else 0.5, t0, step),
                       Metric("cost/cum_rollout_tokens", 1000.0 * step, t0, step), Metric("cost/cum_wall_s", 36.0 * step, t0, step)]
            if seed == 0:  # an optional metric (collect.OPTIONAL_METRICS) that only some trials log
                ms += [Metric("grad_probe/b0/grad_norm_task", 0.5 * step, t0, step) for step in (1, 11)]
            if broken:
                ms = [m for m in ms if m.step <= 12]
            client.log_batch(rid, metrics=ms)
            client.log_text(rid, samples("early"), "samples/eval_step000010.txt")
            if not broken:
                client.log_text(rid, samples("late"), "samples/eval_step000020.txt")
            client.set_terminated(rid, "FAILED" if broken else "FINISHED")
    client.log_text(pid, table.getvalue(), "trials.csv")
    client.set_terminated(pid, "FINISHED")
    return uri
