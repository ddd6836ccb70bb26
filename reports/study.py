"""Tables of a multi-sweep study (docs/reproduction.md) from the MLflow store, as Markdown.

    python reports/study.py --tracking-uri sqlite:///mlflow.db \
        kl_vs_filter entropy_vs_filter filter_strength env_noise annealing > reports/out/study.md
    python reports/study.py docs/data/doors/*.json.gz     # from sweep archives (reports/archive.py)

Per sweep and cell: final validation success, and how each diagnostic moved from the first quarter
of its logged values to the last quarter (each trial's own change, then the mean over seeds with a
95 % bootstrap interval).
Then, pooled over every finished trial of the named sweeps, Spearman's rho between each predictor's
last value and final success (paired bootstrap interval), the across-sweep version of the
per-report predictor page.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report import stats  # noqa: E402
from ragen2_core.report.analysis import SUCCESS, predictors_of, usable  # noqa: E402
from ragen2_core.report.archive import BadArchive, open_sweep  # noqa: E402
from ragen2_core.report.collect import UnknownExperiment  # noqa: E402
from ragen2_core.tracking.mlflow_sink import default_tracking_uri  # noqa: E402

CHANGES = ("collapse/mi", "collapse/mi_zscore_ema", "collapse/mi_perm_zscore_ema", "actor/entropy",
           "rollout/template_frac", "rollout/think_tokens")


def change(trial, metric: str):
    """Mean of the last quarter of the logged values minus mean of the first quarter (at least one
    value each): single MI readings are noisy (SD 0.2-0.3 nats at 8 x 4), a quarter of them less so."""
    _, values = trial.curve(metric)
    if len(values) < 2:
        return None
    k = max(1, len(values) // 4)
    return sum(values[-k:]) / k - sum(values[:k]) / k


def cell_rows(sweep) -> list[str]:
    head = ["arm", "condition", "n", f"final {SUCCESS}", "final eval/template_frac", *(f"Δ {m}" for m in CHANGES)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for arm in sweep.arms:
        for cond in sweep.conditions or ["all"]:
            trials = [t for t in sweep.cell(arm, cond) if usable(t, False)]
            if not trials:
                continue
            success = stats.mean_ci([t.final(SUCCESS) for t in trials])
            template = stats.mean_ci([t.final("eval/template_frac") for t in trials])
            moves = [stats.fmt_ci(stats.mean_ci([change(t, m) for t in trials])) for m in CHANGES]
            lines.append(f"| {arm} | {cond} | {len(trials)} | {stats.fmt_ci(success)} | {stats.fmt_ci(template)} | "
                         + " | ".join(moves) + " |")
    return lines


def pooled_predictors(sweeps) -> list[str]:
    trials = [t for s in sweeps for t in s.trials if usable(t, False)]
    lines = ["| predictor (last value) | Spearman rho with final success [95% CI] | p | n trials |",
             "| --- | --- | --- | --- |"]
    for r in predictors_of(trials):
        est = stats.Estimate(r["rho"], r["low"], r["high"], r["n"], "")
        lines.append(f"| `{r['predictor']}` | {stats.fmt_ci(est)} | {stats.fmt_p(r['p'])} | {r['n']} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="sweep names (MLflow experiments) or archives (*.json.gz)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    args = parser.parse_args(argv)
    uri = args.tracking_uri or default_tracking_uri()
    try:
        sweeps = [open_sweep(name, uri) for name in args.experiments]
    except (UnknownExperiment, BadArchive) as e:
        print(e, file=sys.stderr)
        return 2
    out = []
    for sweep in sweeps:
        out += [f"### {sweep.experiment}", "", *cell_rows(sweep), ""]
    out += ["### pooled over " + ", ".join(s.experiment for s in sweeps), "", *pooled_predictors(sweeps), ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
