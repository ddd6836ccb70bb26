"""Tables of a multi-sweep study (docs/reproduction.md) from the MLflow store, as Markdown.

    ragen2 study --tracking-uri sqlite:///mlflow.db \
        kl_vs_filter entropy_vs_filter filter_strength env_noise annealing > reports/out/study.md
    ragen2 study docs/data/doors/*.json.gz     # from sweep archives (reports/archive.py)
    ragen2 study --reference filter_vs_nofilter filter_vs_nofilter kl_vs_filter annealing
    ragen2 study --reference filter_vs_nofilter --figures docs/figures/doors \
        docs/data/doors/filter_vs_nofilter.json.gz docs/data/doors/env_noise.json.gz
    ragen2 study --reference shaped_noise --reference-condition env.slip=0 --figures DIR shaped_noise.json.gz

Per sweep and cell: final validation success, and how each diagnostic moved from the first quarter
of its logged values to the last quarter (each trial's own change, then the mean over seeds with a
95 % bootstrap interval).
Then the comparisons: in each sweep, every arm against the baseline arm (default `nofilter`) under
the same condition, the filter's effect; with `--reference SWEEP` (the sweep holding the default
cells, e.g. filter_vs_nofilter), also every cell against the reference's cell of the same arm, the
condition's effect, and arms of sweeps without a baseline against the reference's baseline. Per
comparison: the difference in final success with its bootstrap interval and permutation p, the
minimum detectable difference at the spread the two cells showed (80 % power, two-sided 5 %,
t-corrected), and the differences in late MI, entropy, kept fraction and final template share.
With `--reference`, also each arm's effect under each condition minus its effect in the
reference (a difference of differences over four cells, with its interval and MDE): does the
condition change the arm's effect (Q4: does noise shrink the filter's gain)? `--figures DIR` draws
the same against each swept axis, the reference's cells joined at their value of it. A sweep that
holds its default cells itself (slip 0 among its slips) is its own reference with
`--reference-condition`: its other conditions are compared with those cells, never a cell with itself.
Then, pooled over every finished trial of the named sweeps, Spearman's rho between each predictor's
last value and final success (paired bootstrap interval), the across-sweep version of the
per-report predictor page; beside it the same rho within cells (each trial's predictor and success
minus its cell's means), which leaves out what differs between cells and keeps what differs
between seeds.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from ragen2_core.report import stats
from ragen2_core.report.analysis import SUCCESS, is_number, predictors_of, usable
from ragen2_core.report.archive import BadArchive, open_sweep
from ragen2_core.report.collect import UnknownExperiment, axis_value
from ragen2_core.tracking.mlflow_sink import default_tracking_uri

CHANGES = ("collapse/mi", "collapse/mi_zscore_ema", "collapse/mi_perm_zscore_ema", "actor/entropy",
           "rollout/template_frac", "rollout/think_tokens")


def quarters(trial, metric: str, at_least: int = 2):
    """(mean of the first quarter of the logged values, mean of the last quarter), at least one value
    each: single MI readings are noisy (SD 0.2-0.3 nats at 8 x 4), a quarter of them less so.
    None with fewer than ``at_least`` values (a change needs two)."""
    _, values = trial.curve(metric)
    if len(values) < max(1, at_least):
        return None
    k = max(1, len(values) // 4)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def change(trial, metric: str):
    """Last quarter minus first quarter (quarters)."""
    q = quarters(trial, metric)
    return None if q is None else q[1] - q[0]


def cell(sweep, arm: str, cond: str) -> list:
    """A cell's finished trials."""
    return [t for t in sweep.cell(arm, cond) if usable(t, False)]


def same(xs: list, ys: list) -> bool:
    """Two cells holding the same runs (a sweep's own cells and the reference drawn from them)."""
    return {t.run_id for t in xs} == {t.run_id for t in ys}


def reference_cells(sweep, condition: str):
    """The cells of `sweep` under one `condition`, as a one-condition reference: where a sweep holds
    its default cells itself (shaped_noise's slip 0), its other conditions are compared with them."""
    if condition not in sweep.conditions:
        raise ValueError(f"--reference-condition {condition!r}: {sweep.experiment} has no such condition; its "
                         f"conditions: {', '.join(sweep.conditions)}")
    return dataclasses.replace(
        sweep, experiment=f"{sweep.experiment} at {condition}",
        trials=[dataclasses.replace(t, condition="all") for t in sweep.trials if t.condition == condition],
        expected=[e | {"condition": "all"} for e in sweep.expected if e["condition"] == condition])


def cell_rows(sweep) -> list[str]:
    head = ["arm", "condition", "n", f"final {SUCCESS}", "final eval/template_frac",
            "filter/kept_ratio, first → last quarter", *(f"Δ {m}" for m in CHANGES)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for arm in sweep.arms:
        for cond in sweep.conditions or ["all"]:
            trials = cell(sweep, arm, cond)
            if not trials:
                continue
            success = stats.mean_ci([t.final(SUCCESS) for t in trials])
            template = stats.mean_ci([t.final("eval/template_frac") for t in trials])
            moves = [stats.fmt_ci(stats.mean_ci([change(t, m) for t in trials])) for m in CHANGES]
            kept = [quarters(t, "filter/kept_ratio") for t in trials]
            kept = [k for k in kept if k is not None]
            kept_text = (f"{stats.fmt(sum(a for a, _ in kept) / len(kept))} → {stats.fmt(sum(b for _, b in kept) / len(kept))}"
                         if kept else stats.DASH)
            lines.append(f"| {arm} | {cond} | {len(trials)} | {stats.fmt_ci(success)} | {stats.fmt_ci(template)} | "
                         f"{kept_text} | " + " | ".join(moves) + " |")
    return lines


# Training-time curves are noisy per reading (MI: SD 0.2-0.3 nats), so a cell is compared on the mean
# of each trial's last quarter of readings; validation metrics on their final value, the endpoint.
FINAL = (SUCCESS, "eval/template_frac")
SIDES = ("collapse/mi", "actor/entropy", "filter/kept_ratio", "eval/template_frac")  # compared beside success


def late(trial, metric: str):
    if metric in FINAL:
        return trial.final(metric)
    q = quarters(trial, metric, at_least=1)
    return None if q is None else q[1]


def pooled_sd(*samples: list[float]) -> float | None:
    """The per-trial SD pooled over samples that may differ in mean (each about its own mean)."""
    if any(len(x) < 2 for x in samples):
        return None
    ss = sum(sum((v - sum(x) / len(x)) ** 2 for v in x) for x in samples)
    return math.sqrt(ss / (sum(len(x) for x in samples) - len(samples)))


def pairs(sweeps, reference, baseline: str) -> list[tuple[str, str, list, list]]:
    """(sweep, 'cell vs cell', trials, baseline trials) for each comparison the docstring names."""
    ref_cond = None
    if reference is not None:
        conds = reference.conditions or ["all"]
        if len(conds) != 1:
            raise ValueError(f"--reference {reference.experiment}: has {len(conds)} conditions ({', '.join(conds)}); "
                             "a reference holds the default cells under one condition. Name the sweep that does, "
                             f"or the condition of this one that holds them: --reference-condition {conds[0]}")
        ref_cond = conds[0]
    out = []
    for sweep in sweeps:
        for cond in sweep.conditions or ["all"]:
            for arm in sweep.arms:
                trials = cell(sweep, arm, cond)
                if not trials:
                    continue
                base = cell(sweep, baseline, cond)
                if arm != baseline and base:
                    out.append((sweep.experiment, f"{arm} vs {baseline}{under(cond)}", trials, base))
                elif arm != baseline and ref_cond is not None and cell(reference, baseline, ref_cond):
                    out.append((sweep.experiment, f"{arm}{under(cond)} vs {baseline} of {reference.experiment}",
                                trials, cell(reference, baseline, ref_cond)))
                if (reference is not None and sweep is not reference and cell(reference, arm, ref_cond)
                        and not same(trials, cell(reference, arm, ref_cond))):
                    out.append((sweep.experiment, f"{arm}{under(cond)} vs {arm} of {reference.experiment}",
                                trials, cell(reference, arm, ref_cond)))
    return out


def under(cond: str) -> str:
    return "" if cond == "all" else f" ({cond})"


def _pts(est: stats.Estimate) -> str:
    """A difference of success rates in points."""
    scaled = stats.Estimate(*(None if v is None else 100 * v for v in (est.value, est.low, est.high)), est.n, est.method)
    return stats.fmt_ci(scaled, digits=1)


def comparison_rows(sweeps, reference=None, baseline: str = "nofilter") -> list[str]:
    head = ["sweep", "comparison", "n", "Δ success, points [95% CI]", "p", "MDE at this spread, points",
            "Δ late collapse/mi", "Δ late actor/entropy", "Δ late filter/kept_ratio", "Δ final eval/template_frac"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, label, xs, ys in pairs(sweeps, reference, baseline):
        x, y = [late(t, SUCCESS) for t in xs], [late(t, SUCCESS) for t in ys]
        sd = pooled_sd(x, y)
        mde = (stats.fmt(100 * stats.min_detectable_difference(sd, min(len(x), len(y)), t=True), 1)
               if sd is not None else stats.DASH)
        sides = []
        for m in SIDES:
            a = [v for v in (late(t, m) for t in xs) if v is not None]
            b = [v for v in (late(t, m) for t in ys) if v is not None]
            sides.append(stats.fmt_ci(stats.diff_ci(a, b)))
        lines.append(f"| {name} | {label} | {len(x)} vs {len(y)} | {_pts(stats.diff_ci(x, y))} | "
                     f"{stats.fmt_p(stats.permutation_p(x, y))} | {mde} | " + " | ".join(sides) + " |")
    return lines


def interaction_rows(sweeps, reference, baseline: str = "nofilter") -> list[str]:
    """Each arm's effect (arm - baseline) under each condition of a swept sweep, minus the same
    arm's effect in the reference: does the condition change what the arm does? (Q4: the filter's
    gain at slip 0.5 minus its gain at slip 0.) No permutation p: under "no interaction" the four
    cells' seeds are not exchangeable, so only the interval and the MDE are given."""
    head = ["sweep", "effect", "minus", "n", "Δ of Δ success, points [95% CI]", "MDE at this spread, points"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    ref_cond = (reference.conditions or ["all"])[0]

    def finals(sweep, arm, cond):
        return [late(t, SUCCESS) for t in cell(sweep, arm, cond)]

    base_ref = finals(reference, baseline, ref_cond)
    for sweep in sweeps:
        if sweep is reference:
            continue
        for cond in sweep.conditions or ["all"]:
            for arm in sweep.arms:
                cells = [finals(sweep, arm, cond), finals(sweep, baseline, cond),
                         finals(reference, arm, ref_cond), base_ref]
                if arm == baseline or not all(cells) or same(cell(sweep, arm, cond), cell(reference, arm, ref_cond)):
                    continue  # no effect to compare, or the reference's own cells (their effect minus itself)
                sd = pooled_sd(*cells)
                n = min(len(c) for c in cells)
                mde = (stats.fmt(100 * stats.min_detectable_difference(sd, n, t=True, cells=4), 1)
                       if sd is not None else stats.DASH)
                lines.append(f"| {sweep.experiment} | {arm} vs {baseline}{under(cond)} | {arm} vs {baseline} of "
                             f"{reference.experiment} | {' + '.join(str(len(c)) for c in cells)} | "
                             f"{_pts(stats.interaction_ci(*cells))} | {mde} |")
    return lines


def axis_effects(sweep, reference, key: str, baseline: str = "nofilter") -> dict | None:
    """Final success per arm against a numeric axis `key` of `sweep`, the reference's cells joined at
    the reference's value of `key` (slip 0 beside env_noise's 0.25 and 0.5), and each arm's effect
    (arm - baseline) at every value. None when the sweep varies more than `key` (its cells would be
    pooled over the other axes), the reference trials do not all share one value, or a value is not
    a number."""
    if list(sweep.axes) != [key]:
        return None
    joined = {t.run_id: t for t in [*reference.trials, *sweep.trials]}  # a reference drawn from the sweep
    trials = [t for t in joined.values() if usable(t, False)]
    ref_values = {axis_value(t, key) for t in reference.trials if usable(t, False)}
    if len(ref_values) != 1 or not all(is_number(axis_value(t, key)) for t in trials):
        return None
    by_arm: dict = {}
    for t in trials:
        by_arm.setdefault(t.arm, {}).setdefault(float(axis_value(t, key)), []).append(late(t, SUCCESS))
    out = {"key": key, "baseline": baseline, "reference_x": float(next(iter(ref_values))), "arms": {}}
    for arm, by_x in by_arm.items():
        xs = sorted(by_x)
        base = by_arm.get(baseline, {})
        out["arms"][arm] = {"x": xs, "finals": by_x, "success": [stats.mean_ci(by_x[x]) for x in xs],
                            "effect": ([stats.diff_ci(by_x[x], base[x]) if x in base else None for x in xs]
                                       if arm != baseline else None)}
    return out


def draw_axis(effects: dict, title: str, path: Path) -> Path:
    """Two panels: final success per arm, and each arm's effect over the baseline, against the axis."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    for i, (arm, line) in enumerate(effects["arms"].items()):
        for ax, ests, scale, label in ((left, line["success"], 1.0, arm),
                                       (right, line["effect"], 100.0, f"{arm} − {effects['baseline']}")):
            if ests is None:
                continue
            pts = [(x, e) for x, e in zip(line["x"], ests) if e is not None and e.value is not None]
            xs = [x for x, _ in pts]
            ys = [scale * e.value for _, e in pts]
            err = [[scale * (e.value - e.low) if e.low is not None else 0 for _, e in pts],
                   [scale * (e.high - e.value) if e.high is not None else 0 for _, e in pts]]
            seeds = "/".join(sorted({str(len(line["finals"][x])) for x, _ in pts}))
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=f"C{i}", label=f"{label} ({seeds} seeds)")
    right.axhline(0, color="0.5", linewidth=0.8)
    for ax, ylabel in ((left, "final eval/success (mean, 95 % CI)"), (right, "arm − baseline, points (95 % CI)")):
        ax.set_xlabel(effects["key"])
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    fig.savefig(tmp, dpi=80, format="png")
    tmp.replace(path)
    return path


def centred(points: list[tuple]) -> tuple[list[float], list[float]]:
    """(cell, x, y) triples -> x and y minus their cell's means, cells of one trial left out.

    Pooled over cells that differ in algorithm or regulariser, a predictor can track success only
    because both follow the cell (PPO: higher success and lower entropy); within a cell the trials
    differ by seed alone, so the centred values ask whether the predictor tells a cell's better
    seeds from its worse ones. Spearman's p on centred values ignores the degree of freedom each
    cell's mean uses, so with 10 seeds a cell it is slightly optimistic."""
    by_cell: dict = {}
    for cell, x, y in points:
        by_cell.setdefault(cell, []).append((x, y))
    xs, ys = [], []
    for pts in by_cell.values():
        if len(pts) < 2:
            continue
        mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
        xs += [p[0] - mx for p in pts]
        ys += [p[1] - my for p in pts]
    return xs, ys


def pooled_predictors(sweeps) -> list[str]:
    trials = [(s.experiment, t) for s in sweeps for t in s.trials if usable(t, False)]
    lines = ["| predictor (last value) | Spearman rho with final success [95% CI] | p "
             "| within cells: rho [95% CI] | p | n trials |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in predictors_of([t for _, t in trials]):
        est = stats.Estimate(r["rho"], r["low"], r["high"], r["n"], "")
        x, y = centred([((name, t.arm, t.condition), v, t.final(SUCCESS))
                        for name, t in trials if (v := t.final(r["predictor"])) is not None])
        w = stats.spearman_ci(x, y)
        within = stats.Estimate(w["rho"], w["low"], w["high"], w["n"], "")
        lines.append(f"| `{r['predictor']}` | {stats.fmt_ci(est)} | {stats.fmt_p(r['p'])} "
                     f"| {stats.fmt_ci(within)} | {stats.fmt_p(w['p'])} | {r['n']} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="sweep names (MLflow experiments) or archives (*.json.gz)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--reference", help="the sweep holding the default cells (a name among the sweeps, or a file)")
    parser.add_argument("--reference-condition", metavar="COND",
                        help="with --reference: its cells under this condition are the default cells, where the "
                             "reference sweep varies an axis itself (e.g. --reference shaped_noise "
                             "--reference-condition env.slip=0)")
    parser.add_argument("--baseline", default="nofilter", help="the arm others are compared with (default: nofilter)")
    parser.add_argument("--figures", metavar="DIR", help="with --reference: draw success and each arm's effect "
                        "against every numeric axis, the reference's cells joined (DIR/SWEEP-AXIS.png)")
    args = parser.parse_args(argv)
    if args.reference_condition and args.reference is None:
        parser.error("--reference-condition names a condition of the --reference sweep: name that sweep too, "
                     "e.g. --reference shaped_noise --reference-condition env.slip=0")
    if args.figures and args.reference is None:
        parser.error("--figures draws each axis with the reference's cells joined: name the sweep holding "
                     "the default cells with --reference (e.g. --reference filter_vs_nofilter)")
    uri = args.tracking_uri or default_tracking_uri()
    try:
        sweeps = [open_sweep(name, uri) for name in args.experiments]
        reference = None
        if args.reference is not None:
            # named as given on the command line, or by its experiment (an archive's sweep name)
            found = [s for arg, s in zip(args.experiments, sweeps) if args.reference in (arg, s.experiment)]
            if not found:
                raise ValueError(f"--reference {args.reference!r} is not among the sweeps named "
                                 f"({', '.join(s.experiment for s in sweeps)}); name it there too, so its cells "
                                 "are tabled with the rest")
            reference = found[0]
            if args.reference_condition:
                reference = reference_cells(reference, args.reference_condition)
        arms = sorted({arm for s in sweeps for arm in s.arms})
        if args.baseline not in arms:
            raise ValueError(f"--baseline {args.baseline!r} is no arm of the sweeps named; their arms: "
                             f"{', '.join(arms)}. Name one of them, e.g. --baseline {arms[0]}")
        compared = comparison_rows(sweeps, reference, args.baseline)
    except (UnknownExperiment, BadArchive, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    out = []
    for sweep in sweeps:
        out += [f"### {sweep.experiment}", "", *cell_rows(sweep), ""]
    out += ["### comparisons", "", *compared, ""]
    if reference is not None:
        out += [f"### each arm's effect against its effect in {reference.experiment}", "",
                *interaction_rows(sweeps, reference, args.baseline), ""]
    for sweep in sweeps if args.figures else []:
        for key in sweep.axes if sweep is not reference else []:
            effects = axis_effects(sweep, reference, key, args.baseline)
            if effects is not None:
                path = draw_axis(effects, f"{sweep.experiment}: final success against {key} "
                                 f"({reference.experiment}'s cells at {effects['reference_x']:g})",
                                 Path(args.figures) / f"{sweep.experiment}-{key}.png")
                print(f"figure: {path}", file=sys.stderr)
    out += ["### pooled over " + ", ".join(s.experiment for s in sweeps), "", *pooled_predictors(sweeps), ""]
    print("\n".join(out))
    return 0

