"""Tables of a sweep: what the PDF shows and the CSV / JSON files hold, computed once here.

    from ragen2_core.report.analysis import analyse
    result = analyse(sweep, baseline="nofilter")   # dict of tables (lists of plain dicts) and curves

A trial's "final" value of a metric is its value at the last step it was logged. Final numbers
come from FINISHED trials (RUNNING ones too with include_running=True, marked provisional);
failed, running and never-started trials are counted beside every n, never silently dropped.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ragen2_core.report import stats
from ragen2_core.report.collect import Sweep, Trial, axis_value

SUCCESS = "eval/success"
SIDE_METRICS = ("collapse/mi", "actor/entropy", "filter/kept_ratio")
CURVE_METRICS = ("eval/success", "collapse/mi", "collapse/mi_zscore", "collapse/mi_perm_zscore", "actor/entropy",
                 "rollout/template_frac",
                 "rollout/think_tokens", "filter/kept_ratio")
# The release's MI z-score and its EMA first: the paper's Spearman +0.39 is for them.
PREDICTORS = ("collapse/mi_zscore", "collapse/mi_zscore_ema", "collapse/mi_perm_zscore", "collapse/mi_perm_zscore_ema",
              "collapse/mi", "actor/entropy", "rollout/template_frac")
MIN_N = 3  # cells with fewer seeds are flagged inconclusive
ALPHA = 0.05


def usable(t: Trial, include_running: bool) -> bool:
    ok = ("FINISHED", "RUNNING") if include_running else ("FINISHED",)
    return t.status in ok and t.final(SUCCESS) is not None


def counts(sweep: Sweep, arm: str, condition: str, include_running: bool) -> dict:
    cell = sweep.cell(arm, condition)
    planned = sweep.planned(arm, condition)
    return {"planned": planned, "finished": sum(t.status == "FINISHED" for t in cell),
            "failed": sum(t.status in ("FAILED", "KILLED") for t in cell),
            "running": sum(t.status in ("RUNNING", "SCHEDULED") for t in cell),
            "not_started": planned - len(cell),
            "no_success": sum(t.status == "FINISHED" and t.final(SUCCESS) is None for t in cell),
            "n": sum(usable(t, include_running) for t in cell)}


def n_text(c: dict) -> str:
    """'3', or '2 of 3 (1 failed)': the n of a cell with the reason it is short."""
    why = [f"{c[k]} {k.replace('_', ' ')}" for k in ("failed", "running", "not_started") if c[k]]
    if c["no_success"]:
        why.append(f"{c['no_success']} without {SUCCESS}")
    return str(c["n"]) if c["n"] == c["planned"] else f"{c['n']} of {c['planned']}" + (f" ({', '.join(why)})" if why else "")


def finals(trials: list[Trial], metric: str) -> list[float]:
    return [v for v in (t.final(metric) for t in trials) if v is not None]


# ----------------------------------------------------------------------------- main table

def main_table(sweep: Sweep, include_running: bool) -> list[dict]:
    rows = []
    for arm in sweep.arms:
        for cond in sweep.conditions:
            if sweep.planned(arm, cond) == 0:
                continue
            c = counts(sweep, arm, cond, include_running)
            trials = [t for t in sweep.cell(arm, cond) if usable(t, include_running)]
            succ = stats.mean_ci(finals(trials, SUCCESS))
            row = {"arm": arm, "condition": cond, **c, "n_text": n_text(c),
                   **succ.as_dict("success_"), "success_iqm": stats.iqm(finals(trials, SUCCESS)),
                   **{k: v for k, v in stats.t_ci(finals(trials, SUCCESS)).as_dict("success_t_").items()
                      if k in ("success_t_low", "success_t_high")},
                   "provisional": any(t.status == "RUNNING" for t in trials)}
            for m in SIDE_METRICS:
                row |= stats.mean_ci(finals(trials, m)).as_dict(f"{m}:")
            row["inconclusive"] = c["n"] < MIN_N
            rows.append(row)
    scored = [r for r in rows if r["success_value"] is not None]
    best = max((r["success_value"] for r in scored), default=None)
    for r in rows:
        r["best"] = best is not None and r["success_value"] == best
    return rows


# ----------------------------------------------------------------------------- arm vs baseline

def verdict(arm: str, base: str, d: stats.Estimate, p_holm: Optional[float], floor: Optional[float]) -> str:
    if d.value is None or p_holm is None:
        return "not enough runs to compare"
    if p_holm < ALPHA:
        return f"{arm} better than {base}" if d.value > 0 else f"{arm} worse than {base}"
    if floor is not None and floor > ALPHA:
        return f"no evidence (too few seeds: the smallest possible p is {floor:.3f})"
    return "no evidence of a difference"


def comparisons(sweep: Sweep, baseline: Optional[str], include_running: bool) -> list[dict]:
    if baseline is None:
        return []
    rows = []
    for arm in [a for a in sweep.arms if a != baseline]:
        for cond in sweep.conditions:
            if not sweep.planned(arm, cond) or not sweep.planned(baseline, cond):
                continue
            x = finals([t for t in sweep.cell(arm, cond) if usable(t, include_running)], SUCCESS)
            y = finals([t for t in sweep.cell(baseline, cond) if usable(t, include_running)], SUCCESS)
            d = stats.diff_ci(x, y)
            rows.append({"arm": arm, "baseline": baseline, "condition": cond, "n_arm": len(x), "n_baseline": len(y),
                         **d.as_dict("diff_"), "p": stats.permutation_p(x, y),
                         "smallest_p": stats.smallest_p(len(x), len(y))})
    holm, bh = stats.holm([r["p"] for r in rows]), stats.bh([r["p"] for r in rows])
    for r, ph, q in zip(rows, holm, bh):
        r["p_holm"], r["q_bh"] = ph, q
        est = stats.Estimate(r["diff_value"], r["diff_low"], r["diff_high"], r["diff_n"], r["diff_method"])
        r["verdict"] = verdict(r["arm"], r["baseline"], est, ph, r["smallest_p"])
    return rows


# ----------------------------------------------------------------------------- predictors of success

def predictors(sweep: Sweep, include_running: bool) -> list[dict]:
    return predictors_of([t for t in sweep.trials if usable(t, include_running)])


def predictors_of(trials: list[Trial]) -> list[dict]:
    """Spearman rho of each predictor's last value with final success over ``trials`` (any mix of
    sweeps: reports/study.py pools several)."""
    rows = []
    for m in PREDICTORS:
        pts = [(t.final(m), t.final(SUCCESS), t.arm) for t in trials if t.final(m) is not None]
        r = stats.spearman_ci([p[0] for p in pts], [p[1] for p in pts])
        rows.append({"predictor": m, **r, "points": pts, "missing": len(trials) - len(pts)})
    return rows


# ----------------------------------------------------------------------------- cost

def cost(sweep: Sweep, include_running: bool) -> list[dict]:
    rows = []
    for arm in sweep.arms:
        for cond in sweep.conditions:
            trials = [t for t in sweep.cell(arm, cond) if usable(t, include_running)]
            if not sweep.planned(arm, cond):
                continue
            per_tok, per_hour = [], []
            for t in trials:
                s, tok, wall = t.final(SUCCESS), t.final("cost/cum_rollout_tokens"), t.final("cost/cum_wall_s")
                if tok:
                    per_tok.append(s / (tok / 1000))
                if wall:
                    per_hour.append(s / (wall / 3600))
            rows.append({"arm": arm, "condition": cond, **stats.mean_ci(per_tok).as_dict("per_1k_tokens_"),
                         **stats.mean_ci(per_hour).as_dict("per_hour_"),
                         "tokens": stats.mean_ci(finals(trials, "cost/cum_rollout_tokens")).value,
                         "wall_s": stats.mean_ci(finals(trials, "cost/cum_wall_s")).value})
    return rows


# ----------------------------------------------------------------------------- curves

def curve(trials: list[Trial], metric: str) -> dict:
    """Mean over seeds at every step any of them logged, with the bootstrap interval and n."""
    by_step: dict[int, list[float]] = {}
    for t in trials:
        for s, v in zip(*t.curve(metric)):
            if v is not None and math.isfinite(v):
                by_step.setdefault(s, []).append(v)
    steps = sorted(by_step)
    est = [stats.mean_ci(by_step[s]) for s in steps]
    return {"steps": steps, "mean": [e.value for e in est], "low": [e.low for e in est],
            "high": [e.high for e in est], "n": [e.n for e in est]}


def curve_trials(sweep: Sweep, arm: str, cond: str) -> list[Trial]:
    # Failed trials stop early and would change n along the curve; they are counted in the legend.
    return [t for t in sweep.cell(arm, cond) if t.status != "FAILED"]


def sample_efficiency(sweep: Sweep, arm: str) -> dict:
    """IQM of eval/success over all runs of an arm at each eval step, stratified over conditions."""
    steps = sorted({s for t in sweep.trials if t.arm == arm and t.status != "FAILED" for s in t.curve(SUCCESS)[0]})
    out = {"steps": [], "iqm": [], "low": [], "high": [], "n": []}
    for s in steps:
        strata = []
        for cond in sweep.conditions:
            vals = [dict(zip(*t.curve(SUCCESS))).get(s) for t in curve_trials(sweep, arm, cond)]
            strata.append([v for v in vals if v is not None])
        e = stats.stratified_iqm_ci(strata)
        for k, v in zip(("steps", "iqm", "low", "high", "n"), (s, e.value, e.low, e.high, e.n)):
            out[k].append(v)
    return out


# ----------------------------------------------------------------------------- robust aggregates

def robust(sweep: Sweep, baseline: Optional[str], include_running: bool) -> dict:
    def strata(arm):
        return [finals([t for t in sweep.cell(arm, c) if usable(t, include_running)], SUCCESS)
                for c in sweep.conditions]
    iqm = [{"arm": a, **stats.stratified_iqm_ci(strata(a)).as_dict("iqm_")} for a in sweep.arms]
    poi = [] if baseline is None else [
        {"arm": a, "baseline": baseline, **stats.probability_of_improvement(strata(a), strata(baseline)).as_dict("poi_")}
        for a in sweep.arms if a != baseline]
    taus = np.linspace(0, 1, 51)
    profiles = {a: stats.performance_profile([v for s in strata(a) for v in s], taus) for a in sweep.arms}
    return {"iqm": iqm, "poi": poi, "profiles": profiles,
            "efficiency": {a: sample_efficiency(sweep, a) for a in sweep.arms}}


# ----------------------------------------------------------------------------- dose-response

def is_number(x) -> bool:
    """An axis value that can be placed on a numeric axis (a YAML bool is not one)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def numeric_axes(sweep: Sweep) -> list[str]:
    out = []
    for key in sweep.axes:
        vals = {axis_value(t, key) for t in sweep.trials} - {None}
        if len(vals) > 1 and all(is_number(v) for v in vals):
            out.append(key)
    return out


def geometric(values: list[float]) -> bool:
    """Positive values (a zero aside) whose successive ratios are about equal, e.g. 0.001, 0.01, 0.1."""
    pos = sorted(v for v in set(values) if v > 0)
    if len(pos) < 3:
        return False
    ratios = np.diff(np.log(pos))
    return bool(ratios.min() > 0 and ratios.max() / ratios.min() < 2.5 and pos[-1] / pos[0] >= 20)


def dose_response(sweep: Sweep, key: str, include_running: bool) -> dict:
    """Per line (an arm plus the values of the other axes): final success and MI against `key`."""
    others = [k for k in sweep.axes if k != key]
    lines: dict[str, dict] = {}
    for t in sweep.trials:
        if not usable(t, include_running):
            continue
        label = " ".join([t.arm] + [f"{k}={axis_value(t, k)}" for k in others])
        x = axis_value(t, key)
        if x is None:
            continue
        line = lines.setdefault(label, {})
        line.setdefault(float(x), []).append(t)
    out = {}
    for label, by_x in lines.items():
        xs = sorted(by_x)
        out[label] = {"x": xs, "success": [stats.mean_ci(finals(by_x[x], SUCCESS)) for x in xs],
                      "mi": [stats.mean_ci(finals(by_x[x], "collapse/mi")) for x in xs]}
    values = [axis_value(t, key) for t in sweep.trials]
    return {"key": key, "lines": out, "geometric": geometric([float(v) for v in values if v is not None])}


# ----------------------------------------------------------------------------- all of it

def analyse(sweep: Sweep, baseline: Optional[str] = None, include_running: bool = False) -> dict:
    table = main_table(sweep, include_running)
    seeds = {a: sorted({t.seed for t in sweep.trials if t.arm == a and usable(t, include_running)}) for a in sweep.arms}
    return {"table": table, "comparisons": comparisons(sweep, baseline, include_running),
            "predictors": predictors(sweep, include_running), "cost": cost(sweep, include_running),
            "robust": robust(sweep, baseline, include_running),
            "dose": [dose_response(sweep, k, include_running) for k in numeric_axes(sweep)],
            "seeds": seeds, "baseline": baseline, "include_running": include_running}
