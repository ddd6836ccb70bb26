"""The report's pages as matplotlib figures (A4 landscape), one function per section.

Every function returns a list of figures so a section may span pages. Text is drawn as text
(TrueType fonts, see build.py), so the PDF can be searched and copied from.
"""
from __future__ import annotations

import textwrap

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from ragen2_core.report import stats
from ragen2_core.report.analysis import CURVE_METRICS, SIDE_METRICS, SUCCESS, curve, curve_trials
from ragen2_core.report.collect import Sweep

A4 = (11.69, 8.27)
ROWS_PER_PAGE = 20
UNITS = {"eval/success": "fraction of validation episodes", "collapse/mi": "nats", "collapse/mi_zscore": "z",
         "collapse/mi_zscore_ema": "z", "collapse/mi_perm_zscore": "z (permutation null)",
         "collapse/mi_perm_zscore_ema": "z (permutation null)", "actor/entropy": "nats per token",
         "rollout/template_frac": "fraction of turns", "rollout/think_tokens": "tokens per turn", "filter/kept_ratio": "fraction of groups",
         "cost/cum_rollout_tokens": "tokens", "cost/cum_wall_s": "s"}
f, fci, fp, DASH = stats.fmt, stats.fmt_ci, stats.fmt_p, stats.DASH


def colors(arms: list[str]) -> dict[str, tuple]:
    cmap = matplotlib.colormaps["tab10"]
    return {a: cmap(i % 10) for i, a in enumerate(arms)}


def page(title: str, subtitle: str = "") -> Figure:
    fig = Figure(figsize=A4)
    fig.text(0.04, 0.95, title, fontsize=16, weight="bold", va="top")
    if subtitle:
        fig.text(0.04, 0.905, textwrap.fill(subtitle, 150), fontsize=9, va="top", color="0.3")
    return fig


def block(fig: Figure, x: float, y: float, text: str, size: float = 9, width: int = 150, mono: bool = False) -> None:
    lines = [w for para in text.split("\n") for w in (textwrap.wrap(para, width) or [""])]
    fig.text(x, y, "\n".join(lines), fontsize=size, va="top", family="monospace" if mono else None,
             linespacing=1.35)


def table(ax, header: list[str], rows: list[list[str]], bold: set[int] = frozenset(), size: float = 8) -> None:
    ax.axis("off")
    if not rows:
        ax.text(0, 1, "(no rows)", va="top", fontsize=size)
        return
    t = ax.table(cellText=rows, colLabels=header, loc="upper left", cellLoc="left", colLoc="left")
    t.auto_set_font_size(False)
    t.set_fontsize(size)
    t.auto_set_column_width(list(range(len(header))))
    row_h = 0.24 / (ax.get_position().height * ax.figure.get_figheight())  # about 0.24 inch per row
    for (r, _), cell in t.get_celld().items():
        cell.set_height(row_h)
        if r == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("0.9")
        elif r - 1 in bold:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("#fff3c4")


def _nan(xs) -> np.ndarray:
    return np.asarray([np.nan if x is None else x for x in xs], float)


# ----------------------------------------------------------------------------- 1. title

def title_page(sweep: Sweep, result: dict, provenance: dict) -> list[Figure]:
    fig = page(f"Sweep report: {sweep.experiment}", f"MLflow {sweep.tracking_uri}  ·  experiment id "
               f"{sweep.experiment_id}  ·  built {provenance['built']}")
    question = provenance["question"] or "(the spec states no question: add a '# Question:' comment to its YAML)"
    block(fig, 0.04, 0.86, "Question: " + question, size=11, width=120)
    seeds = "; ".join(f"{a}: {len(s)} seeds ({', '.join(s)})" for a, s in result["seeds"].items())
    lines = [f"Trials: {provenance['counts']}", f"Seeds with a final {SUCCESS} per arm: {seeds or 'none'}",
             f"Code: git {provenance['git']}", f"Config hashes: {provenance['hashes']}",
             f"Versions: {provenance['versions']}", f"Dates: {provenance['dates']}"]
    if result["include_running"]:
        lines.append("Running trials are included with their latest values: numbers are provisional.")
    lines += [f"Note: {n}" for n in sweep.notes]
    block(fig, 0.04, 0.76, "\n".join(lines), size=8.5, width=170)
    spec = sweep.spec_text.strip().splitlines() or ["(no spec.yaml on the sweep run)"]
    cut = len(spec) > 45
    block(fig, 0.04, 0.50, "Spec:\n" + "\n".join(spec[:45]) + ("\n... (cut; full spec in MLflow)" if cut else ""),
          size=6.5, width=200, mono=True)
    return [fig]


# ----------------------------------------------------------------------------- 2. main table

def table_pages(result: dict) -> list[Figure]:
    rows = result["table"]
    header = ["arm", "condition", "n seeds", "final success [95% CI]", "t-interval", "IQM", "collapse/mi",
              "actor/entropy", "filter/kept_ratio", "note"]
    cells, bold = [], set()
    for i, r in enumerate(rows):
        note = []
        if r["best"]:
            note.append("best")
            bold.add(i)
        if r["inconclusive"]:
            note.append("n<3: inconclusive")
        if r["provisional"]:
            note.append("provisional")
        side = [fci(stats.Estimate(r[f"{m}:value"], r[f"{m}:low"], r[f"{m}:high"], r[f"{m}:n"], "")) for m in SIDE_METRICS]
        succ = stats.Estimate(r["success_value"], r["success_low"], r["success_high"], r["success_n"], "")
        tint = DASH if r["success_t_low"] is None else f"[{f(r['success_t_low'])}, {f(r['success_t_high'])}]"
        cells.append([r["arm"], r["condition"], r["n_text"], fci(succ), tint, f(r["success_iqm"]), *side,
                      ", ".join(note)])
    methods = sorted({r["success_method"] for r in rows})
    n_min = min((r["n"] for r in rows), default=0)
    legend = (f"Final value = value at each trial's last logged step. Mean over seeds with a 95 % interval; "
              f"interval methods used: {'; '.join(methods) or 'none'}. t-interval = Student-t 95 % interval of "
              f"the same mean (assumes normal seed noise; wider, and honest where the bootstrap is not). "
              f"IQM = interquartile mean over seeds. "
              f"{stats.DASH} = no value. Best cell (highest mean final success) in bold. " + stats.few_seeds_note(n_min))
    pages = []
    for start in range(0, max(len(cells), 1), ROWS_PER_PAGE):
        part = cells[start:start + ROWS_PER_PAGE]
        fig = page("Main table: final values per arm and condition" + (" (continued)" if start else ""),
                   f"success = {SUCCESS} (fraction of validation episodes); n seeds = trials with a final value, "
                   "of those planned (failed / running / not started named)")
        ax = fig.add_axes([0.04, 0.2, 0.92, 0.66])
        table(ax, header, part, {i - start for i in bold if start <= i < start + ROWS_PER_PAGE}, size=6.8)
        block(fig, 0.04, 0.15, legend, size=8, width=190)
        pages.append(fig)
    return pages


# ----------------------------------------------------------------------------- 3. learning curves

def grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return (n + cols - 1) // cols, cols


def curve_pages(sweep: Sweep, metrics=CURVE_METRICS) -> list[Figure]:
    col = colors(sweep.arms)
    conds = sweep.conditions or ["all"]
    pages = []
    for m in metrics:
        fig = page(f"Learning curves: {m}", "mean over seeds, band = 95 % bootstrap interval per step; "
                   "failed trials left out (counted in the legend)")
        rows, cols = grid(len(conds))
        axes = fig.subplots(rows, cols, squeeze=False)
        fig.subplots_adjust(top=0.84, bottom=0.08, hspace=0.45, wspace=0.25)
        for ax, cond in zip(axes.flat, conds):
            for arm in sweep.arms:
                trials = curve_trials(sweep, arm, cond)
                failed = sum(t.status == "FAILED" for t in sweep.cell(arm, cond))
                c = curve(trials, m)
                if not c["steps"]:
                    continue
                label = f"{arm} (n={max(c['n'])} seeds" + (f", {failed} failed" if failed else "") + ")"
                ax.plot(c["steps"], _nan(c["mean"]), color=col[arm], label=label, marker=".")
                ax.fill_between(c["steps"], _nan(c["low"]), _nan(c["high"]), color=col[arm], alpha=0.2)
            ax.set_title(cond, fontsize=9)
            ax.set_xlabel("training step")
            ax.set_ylabel(f"{m} ({UNITS.get(m, '')})", fontsize=8)
            if ax.lines:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, f"no {m} logged", ha="center", transform=ax.transAxes)
        for ax in list(axes.flat)[len(conds):]:
            ax.axis("off")
        pages.append(fig)
    return pages


# ----------------------------------------------------------------------------- 4. dose-response

def dose_pages(result: dict, arms: list[str]) -> list[Figure]:
    if not result["dose"]:
        fig = page("Dose-response", "")
        block(fig, 0.04, 0.85, "The sweep varied no numeric axis besides the arms, so there is no dose-response to draw.")
        return [fig]
    col = colors(arms)
    pages = []
    for d in result["dose"]:
        fig = page(f"Dose-response: {d['key']}", "final value per trial, mean over seeds with 95 % interval; "
                   + ("symmetric-log x axis (geometric grid)" if d["geometric"] else "linear x axis"))
        axes = fig.subplots(1, 2)
        fig.subplots_adjust(top=0.82, bottom=0.12, wspace=0.25)
        for ax, what, unit in zip(axes, ("success", "mi"), (UNITS[SUCCESS], "nats")):
            for k, (label, line) in enumerate(d["lines"].items()):
                est = line[what]
                y, lo, hi = _nan([e.value for e in est]), _nan([e.low for e in est]), _nan([e.high for e in est])
                arm = label.split()[0]
                ns = sorted({e.n for e in est})
                ax.errorbar(line["x"], y, yerr=[np.nan_to_num(y - lo), np.nan_to_num(hi - y)], marker="o", capsize=3,
                            color=col.get(arm), linestyle=["-", "--", ":", "-."][k % 4],
                            label=f"{label} (n={'/'.join(map(str, ns))} seeds)")
            if d["geometric"]:
                pos = [x for line in d["lines"].values() for x in line["x"] if x > 0]
                ax.set_xscale("symlog", linthresh=min(pos) if pos else 1e-3)
            ax.set_xlabel(d["key"])
            ax.set_ylabel(f"final {'eval/success' if what == 'success' else 'collapse/mi'} ({unit})")
            ax.set_title("final success" if what == "success" else "final MI (collapse/mi)", fontsize=10)
            ax.legend(fontsize=7)
        pages.append(fig)
    return pages


# ----------------------------------------------------------------------------- 5. arm vs baseline

def comparison_pages(result: dict) -> list[Figure]:
    rows, base = result["comparisons"], result["baseline"]
    fig = page(f"Each arm against {base or 'a baseline'}: difference in final {SUCCESS}",
               "difference of means (arm − baseline) with 95 % bootstrap interval; two-sided permutation test; "
               "p adjusted over all cells (Holm: family-wise; BH: false discovery rate)")
    if not rows:
        why = ("no baseline arm: name one with --baseline ARM (the default is 'nofilter' when the sweep has it)"
               if base is None else "no condition has runs of both arms")
        block(fig, 0.04, 0.85, f"Nothing to compare: {why}.")
        return [fig]
    header = ["arm", "condition", "n arm / base", "difference [95% CI]", "p", "p Holm", "q BH", "what it supports"]
    cells = [[r["arm"], r["condition"], f"{r['n_arm']} / {r['n_baseline']}",
              fci(stats.Estimate(r["diff_value"], r["diff_low"], r["diff_high"], r["diff_n"], "")),
              fp(r["p"]), fp(r["p_holm"]), fp(r["q_bh"]), r["verdict"]] for r in rows[:12]]
    better = [r for r in rows if r["verdict"].endswith(f"better than {base}")]
    worse = [r for r in rows if r["verdict"].endswith(f"worse than {base}")]
    floor = min((r["smallest_p"] for r in rows if r["smallest_p"] is not None), default=None)
    summary = (f"In {len(better)} of {len(rows)} comparisons an arm is better than {base}, in {len(worse)} worse "
               f"(Holm-adjusted p < 0.05); the rest show no evidence either way.")
    if floor is not None and floor > 0.05:
        summary += (f" With these seed counts a permutation test cannot go below p = {floor:.3f}: "
                    "more seeds are needed before any difference can be called significant.")
    block(fig, 0.04, 0.865, summary, size=10, width=150)
    table(fig.add_axes([0.04, 0.45, 0.92, 0.33]), header, cells, size=7.5)
    ax = fig.add_axes([0.30, 0.07, 0.45, 0.3])
    labels = [f"{r['arm']} | {r['condition']}" for r in rows[:12]]
    y = np.arange(len(labels))[::-1]
    v, lo, hi = _nan([r["diff_value"] for r in rows[:12]]), _nan([r["diff_low"] for r in rows[:12]]), \
        _nan([r["diff_high"] for r in rows[:12]])
    ax.errorbar(v, y, xerr=[np.nan_to_num(v - lo), np.nan_to_num(hi - v)], fmt="o", capsize=3)
    ax.axvline(0, color="0.5", linestyle="--")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_ylim(-1, len(labels))
    ax.set_xlabel(f"difference in final {SUCCESS} (arm − {base}; fraction)")
    ax.set_title("differences with 95 % intervals", fontsize=9)
    methods = "; ".join(sorted({r["diff_method"] for r in rows}))
    block(fig, 0.04, 0.43, f"Interval methods: {methods}. "
          + (f"{len(rows) - 12} more rows in the CSV. " if len(rows) > 12 else ""), size=7.5, width=200)
    return [fig]


# ----------------------------------------------------------------------------- 6. predictors

def predictor_pages(result: dict, arms: list[str]) -> list[Figure]:
    col = colors(arms)
    rows = result["predictors"]
    fig = page("MI vs entropy as predictors of final success",
               "Spearman rank correlation across trials, 95 % paired bootstrap interval; x = each trial's "
               "last measured value, y = its final eval/success")
    axes = fig.subplots(1, len(rows))
    fig.subplots_adjust(top=0.62, bottom=0.12, wspace=0.45)
    for ax, r in zip(np.atleast_1d(axes), rows):
        for arm in arms:
            pts = [(x, y) for x, y, a in r["points"] if a == arm]
            if pts:
                ax.scatter(*zip(*pts), color=col[arm], label=f"{arm} ({len(pts)} trials)", s=18)
        ax.set_xlabel(f"last {r['predictor']}\n({UNITS.get(r['predictor'], '')})", fontsize=7)
        ax.set_ylabel(f"final {SUCCESS} (fraction)", fontsize=8)
        rho = fci(stats.Estimate(r["rho"], r["low"], r["high"], r["n"], ""))
        ax.set_title(f"rho = {rho}\n(n={r['n']} trials)", fontsize=8)
        if ax.collections:
            ax.legend(fontsize=6)
    header = ["predictor", "Spearman rho [95% CI]", "p", "n trials", "interval method"]
    cells = [[r["predictor"], fci(stats.Estimate(r["rho"], r["low"], r["high"], r["n"], "")), fp(r["p"]), str(r["n"]),
              r["method"]] for r in rows]
    table(fig.add_axes([0.04, 0.7, 0.92, 0.17]), header, cells, size=8)
    return [fig]


# ----------------------------------------------------------------------------- 7. what collapse looks like

def example_pages(examples: list[dict]) -> list[Figure]:
    fig = page("What collapse looks like: first-turn reasoning, early vs late",
               "greedy validation episodes on the same validation seeds (trial artifacts samples/eval_step*.txt)")
    if not examples:
        block(fig, 0.04, 0.85, "No trial logged validation samples (samples/eval_stepNNNNNN.txt), so there is "
                               "nothing to show.")
        return [fig]
    y = 0.86
    for ex in examples:
        head = (f"{ex['which']} cell: {ex['arm']} | {ex['condition']} (mean final success {f(ex['success'])}); "
                f"trial {ex['trial_id']}, seed {ex['seed']}; steps {ex['early']} vs {ex['late']}; "
                f"distinct reasonings: {ex['distinct_early']} of {ex['n']} early, {ex['distinct_late']} of {ex['n']} late")
        block(fig, 0.04, y, head, size=8.5, width=190)
        y -= 0.05
        if ex.get("missing"):
            block(fig, 0.06, y, ex["missing"], size=8)
            y -= 0.06
            continue
        for s in ex["seeds"]:
            early, late = ex["early_text"][s], ex["late_text"][s]
            block(fig, 0.05, y, f"val seed {s}  early ({'solved' if early['success'] else 'failed'}):  "
                  + _clip(early["think"]), size=7, width=125, mono=True)
            block(fig, 0.05, y - 0.05, f"val seed {s}  late  ({'solved' if late['success'] else 'failed'}):  "
                  + _clip(late["think"]), size=7, width=125, mono=True)
            y -= 0.115
        y -= 0.01
    return [fig]


def _clip(text: str, n: int = 230) -> str:
    text = " ".join(text.split()) or "(empty)"
    return text if len(text) <= n else text[:n] + " ..."


# ----------------------------------------------------------------------------- 8. cost

def cost_pages(sweep: Sweep, result: dict) -> list[Figure]:
    col = colors(sweep.arms)
    fig = page("Cost: success per unit of compute",
               "final eval/success divided by the trial's cumulative rollout tokens (per 1k) and wall time (per hour)")
    header = ["arm", "condition", "success per 1k rollout tokens", "success per wall-clock hour",
              "rollout tokens (mean)", "wall s (mean)"]
    cells = []
    for r in result["cost"][:14]:
        a = stats.Estimate(r["per_1k_tokens_value"], r["per_1k_tokens_low"], r["per_1k_tokens_high"], 0, "")
        b = stats.Estimate(r["per_hour_value"], r["per_hour_low"], r["per_hour_high"], 0, "")
        cells.append([r["arm"], r["condition"], f"{fci(a, 4)} (n={r['per_1k_tokens_n']})",
                      f"{fci(b)} (n={r['per_hour_n']})", f(r["tokens"], 0), f(r["wall_s"], 1)])
    table(fig.add_axes([0.04, 0.5, 0.92, 0.37]), header, cells, size=7.5)
    ax = fig.add_axes([0.08, 0.08, 0.55, 0.34])
    for arm in sweep.arms:
        xs, ys = [], []
        for t in sweep.trials:
            if t.arm != arm or t.status == "FAILED":
                continue
            tok = dict(zip(*t.curve("cost/cum_rollout_tokens")))
            for s, v in zip(*t.curve(SUCCESS)):
                if s in tok:
                    xs.append(tok[s]), ys.append(v)
        if xs:
            n = len({t.seed for t in sweep.trials if t.arm == arm and t.status != "FAILED"})
            ax.scatter(xs, ys, color=col[arm], s=12, alpha=0.7, label=f"{arm} (all conditions, {n} seeds)")
    ax.set_xlabel("cumulative rollout tokens (tokens)")
    ax.set_ylabel(f"{SUCCESS} at that step (fraction)")
    ax.set_title("success against generation spent, every eval of every trial", fontsize=9)
    if ax.collections:
        ax.legend(fontsize=7)
    return [fig]


# ----------------------------------------------------------------------------- 9. robust aggregates

def robust_pages(sweep: Sweep, result: dict) -> list[Figure]:
    rb, col, base = result["robust"], colors(sweep.arms), result["baseline"]
    fig = page("Robust aggregates (rliable, Agarwal et al. 2021)",
               f"final {SUCCESS}; conditions are strata: runs are resampled within each condition; 95 % percentile intervals")
    axes = fig.subplots(2, 2)
    fig.subplots_adjust(top=0.84, bottom=0.08, hspace=0.5, wspace=0.3)
    ax = axes[0, 0]
    for i, r in enumerate(rb["iqm"]):
        if r["iqm_value"] is not None:
            lo = r["iqm_value"] - (r["iqm_low"] if r["iqm_low"] is not None else r["iqm_value"])
            hi = (r["iqm_high"] if r["iqm_high"] is not None else r["iqm_value"]) - r["iqm_value"]
            ax.errorbar(r["iqm_value"], i, xerr=[[lo], [hi]], fmt="o", color=col[r["arm"]], capsize=4)
    ax.set_yticks(range(len(rb["iqm"])), [f"{r['arm']} (n={r['iqm_n']} runs)" for r in rb["iqm"]], fontsize=7)
    ax.set_ylim(-1, len(rb["iqm"]))
    ax.set_xlabel(f"IQM of final {SUCCESS} (fraction)")
    ax.set_title("interquartile mean, stratified bootstrap", fontsize=9)
    ax = axes[0, 1]
    if rb["poi"]:
        for i, r in enumerate(rb["poi"]):
            if r["poi_value"] is not None:
                lo = r["poi_value"] - (r["poi_low"] if r["poi_low"] is not None else r["poi_value"])
                hi = (r["poi_high"] if r["poi_high"] is not None else r["poi_value"]) - r["poi_value"]
                ax.errorbar(r["poi_value"], i, xerr=[[lo], [hi]], fmt="o", color=col[r["arm"]], capsize=4)
        ax.axvline(0.5, color="0.5", linestyle="--")
        ax.set_yticks(range(len(rb["poi"])), [f"P({r['arm']} > {base}) (n={r['poi_n']} runs)" for r in rb["poi"]],
                      fontsize=7)
        ax.set_ylim(-1, len(rb["poi"]))
        ax.set_xlim(-0.02, 1.02)
    else:
        ax.text(0.5, 0.5, "no baseline arm: no probability of improvement", ha="center", transform=ax.transAxes)
    ax.set_xlabel("probability of improvement (0.5 = no difference)")
    ax.set_title("probability that a run of the arm beats a run of the baseline", fontsize=9)
    ax = axes[1, 0]
    for arm, p in rb["profiles"].items():
        if p["frac"] is not None:
            ax.plot(p["tau"], p["frac"], color=col[arm], label=f"{arm} (n={p['n']} runs)")
            ax.fill_between(p["tau"], p["low"], p["high"], color=col[arm], alpha=0.2)
    ax.set_xlabel(f"threshold tau on final {SUCCESS} (fraction)")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_title("performance profile", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=7)
    ax = axes[1, 1]
    for arm, e in rb["efficiency"].items():
        if e["steps"]:
            ax.plot(e["steps"], _nan(e["iqm"]), color=col[arm], marker=".", label=f"{arm} (n={max(e['n'])} runs)")
            ax.fill_between(e["steps"], _nan(e["low"]), _nan(e["high"]), color=col[arm], alpha=0.2)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"IQM of {SUCCESS} (fraction)")
    ax.set_title("sample efficiency: IQM over runs at each eval step", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=7)
    return [fig]
