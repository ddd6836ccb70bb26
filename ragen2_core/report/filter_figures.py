"""The report's filter page: how often each arm's filter dropped groups (kept groups per step,
pooled over its trials) and, where logged, which reward spreads it kept and dropped.

    from ragen2_core.report.filter_figures import filter_pages
    pages = filter_pages(sweep)          # a list of matplotlib figures, one per four cells
"""
from __future__ import annotations

import math
import textwrap
from collections import Counter
from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from ragen2_core import presets
from ragen2_core.report.analysis import curve_trials
from ragen2_core.report.collect import Sweep, Trial, parse_value
from ragen2_core.report.figures import DASH, grid, block, colors, f, page

KEPT, RATIO, N_GROUPS = "filter/kept_groups", "filter/kept_ratio", "rollout.n_groups"
KEPT_STD, DROPPED_STD = "filter/kept_group_reward_std", "filter/dropped_group_reward_std_max"
FILTER_TITLE = "What the filter dropped: kept groups per step and the spreads it cut"
FILTER_SUBTITLE = ("bars: share of training steps at each number of kept groups, pooled over the arm's trials "
                   "(failed left out); beside them, when logged, the reward spreads kept and dropped")
FILTER_CELLS_PER_PAGE = 4
COUNTED = ("logged", "from kept_ratio")  # kept_counts' sources that yield counts; any other is why not


def n_groups_of(trial: Trial) -> Optional[int]:
    """The trial's groups per step (param rollout.n_groups); None when not recorded."""
    n = parse_value(trial.params.get(N_GROUPS, ""))
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def kept_counts(trial: Trial) -> tuple[list[int], str]:
    """Kept groups at each step the filter logged, and where they came from: "logged",
    "from kept_ratio", or why the trial has none."""
    kept = [k for k in trial.curve(KEPT)[1] if math.isfinite(k)]
    if kept:
        return [round(k) for k in kept], "logged"
    ratios = [r for r in trial.curve(RATIO)[1] if math.isfinite(r)]
    if not ratios:
        return [], f"logged neither {KEPT} nor {RATIO}"
    n = n_groups_of(trial)
    if n is None:
        return [], f"logged only {RATIO} and no {N_GROUPS} param, so its counts are not guessed"
    # trials older than filter/kept_groups: kept_ratio is kept / n_groups, which this undoes exactly
    counts = [r * n for r in ratios]
    if any(abs(c - round(c)) > 1e-6 for c in counts):
        return [], f"{RATIO} × {N_GROUPS} ({n}) is not a whole number of groups"
    return [round(c) for c in counts], "from kept_ratio"


def kept_histogram(trials: list[Trial]) -> dict:
    """Share of steps at each number of kept groups 0..n_groups, pooled over the trials' steps;
    with the mean kept fraction and the share of steps that dropped at least one group."""
    counts, fractions, sizes, sources, counted = [], [], set(), Counter(), 0
    for t in trials:
        kept, source = kept_counts(t)
        sources[source] += 1
        counted += bool(kept)
        counts += kept
        n = n_groups_of(t)
        if n is not None:
            sizes.add(n)
            fractions += [k / n for k in kept]
    n_groups = max(sizes) if sizes else None
    top = max([*counts, n_groups or 0])
    return {"n_groups": n_groups, "steps": len(counts), "sources": dict(sources), "counted": counted,
            "shares": [counts.count(k) / len(counts) for k in range(top + 1)] if counts else [],
            "mean_fraction": float(np.mean(fractions)) if fractions else None,
            "filtered_share": float(np.mean([x < 1 for x in fractions])) if fractions else None}


def spreads(trials: list[Trial], metric: str) -> Optional[list[float]]:
    """Per-step values pooled over trials, NaN steps (nothing kept or dropped to measure) left
    out; None when no trial logged the metric at all."""
    if not any(metric in t.history for t in trials):
        return None
    return [v for t in trials for v in t.curve(metric)[1] if math.isfinite(v)]


def is_no_filter(trial: Trial) -> bool:
    """Whether the trial ran the no-filter preset, which keeps every group by construction."""
    return presets.uses(trial.params, "filter", "nofilter", parse_value) and trial.params.get("filter.schedule.kind", "const") == "const"


def filter_cell(sweep: Sweep, arm: str, condition: str) -> dict:
    trials = curve_trials(sweep, arm, condition)
    return {"arm": arm, "condition": condition, "trials": len(trials), **kept_histogram(trials),
            "kept_std": spreads(trials, KEPT_STD), "dropped_std": spreads(trials, DROPPED_STD),
            "no_filter": bool(trials) and all(is_no_filter(t) for t in trials)}


def filter_cells(sweep: Sweep) -> tuple[list[dict], list[dict]]:
    """(cells drawn, cells left out). Past one page of cells, those running the no-filter preset
    make room: their single bar at n_groups is known before the run."""
    cells = [filter_cell(sweep, a, c) for a in sweep.arms for c in (sweep.conditions or ["all"])]
    cells = [c for c in cells if c["trials"]]
    if len(cells) <= FILTER_CELLS_PER_PAGE or all(c["no_filter"] for c in cells):
        return cells, []
    return [c for c in cells if not c["no_filter"]], [c for c in cells if c["no_filter"]]


def _cell_label(cell: dict) -> str:
    return cell["arm"] if cell["condition"] == "all" else f"{cell['arm']} | {cell['condition']}"


def _kept_panel(ax, cell: dict, color) -> None:
    shares, n = cell["shares"], cell["n_groups"]
    if not shares:
        ax.axis("off")
        ax.set_title(_cell_label(cell), fontsize=7.5)
        why = "; ".join(f"{k} trial(s) {s}" for s, k in cell["sources"].items())
        ax.text(0.5, 0.5, textwrap.fill(f"no kept counts: {why}", 36), ha="center", va="center",
                transform=ax.transAxes, fontsize=7)
        return
    ax.bar(range(len(shares)), shares, color=color)
    for k, share in enumerate(shares):
        if share:
            ax.text(k, share + 0.02, f"{share:.2f}", ha="center", fontsize=6)
    ax.set_xticks(range(len(shares)))
    ax.set_xlim(-0.6, len(shares) - 0.4)
    ax.set_ylim(0, 1.12)
    ax.set_xlabel(f"kept groups of {n} per step" if n else f"kept groups per step ({N_GROUPS} not recorded)",
                  fontsize=7)
    ax.set_ylabel("share of steps", fontsize=7)
    dropped = DASH if cell["filtered_share"] is None else f"{100 * cell['filtered_share']:.0f} %"
    counted = cell["counted"] if cell["counted"] == cell["trials"] else f"{cell['counted']} of {cell['trials']}"
    lines = [_cell_label(cell), f"mean kept fraction {f(cell['mean_fraction'])}",
             f"dropped a group on {dropped} of {cell['steps']} steps ({counted} trials)"]
    ax.set_title("\n".join(textwrap.fill(line, 32) for line in lines), fontsize=7.5)


def _spread_status(cell: dict) -> str:
    dropped = cell["dropped_std"]
    if dropped is None:
        return f"dropped spreads not recorded for these trials (no {DROPPED_STD})"
    if not dropped:
        return "no group was dropped at any step"
    zero = sum(v == 0 for v in dropped)
    return f"only equal-reward groups (largest dropped spread 0) on {zero} of {len(dropped)} steps that dropped"


def _spread_panel(ax, cell: dict, color) -> None:
    series = [(v, c, label) for v, c, label in
              ((cell["kept_std"], "0.6", "kept: mean spread"),
               (cell["dropped_std"], color, "dropped: largest spread")) if v]
    ax.set_title(textwrap.fill(_spread_status(cell), 32), fontsize=7)
    if not series:
        ax.axis("off")
        kept = "" if cell["kept_std"] is None else "; kept spreads have no finite value"
        ax.text(0.5, 0.5, f"nothing to draw{kept}", ha="center", va="center", transform=ax.transAxes, fontsize=7)
        return
    top = max(max(v) for v, _, _ in series)
    bins = np.linspace(0, top if top > 0 else 1.0, 21)  # from 0, so equal-reward groups sit at the left edge
    for values, c, label in series:
        ax.hist(values, bins=bins, weights=np.full(len(values), 1 / len(values)), color=c, alpha=0.6,
                label=f"{label} ({len(values)} steps)")
    ax.set_xlabel("in-group reward std (reward)", fontsize=7)
    ax.set_ylabel("share of those steps", fontsize=7)
    ax.set_ylim(0, 1.35 * ax.get_ylim()[1])  # headroom for the legend
    ax.legend(fontsize=6, loc="upper right")


def _filter_notes(shown: list[dict], left_out: list[dict]) -> str:
    derived = sum(c["sources"].get("from kept_ratio", 0) for c in shown)
    uncounted = Counter()
    for c in shown:
        uncounted.update({s: k for s, k in c["sources"].items() if s not in COUNTED})
    notes = ["A filter that never drops a group is no filter: mass only at the full count means it let every "
             "group through."]
    if derived:
        notes.append(f"Kept counts of {derived} trial(s) are round({RATIO} × {N_GROUPS}): they predate {KEPT}.")
    notes += [f"{k} trial(s) {why}: left out of the bars." for why, k in uncounted.items()]
    if all(c["dropped_std"] is None for c in shown):
        notes.append(f"Dropped spreads were not recorded for this sweep: its trials predate {DROPPED_STD}.")
    if left_out:
        notes.append("Left out, as their filter is the no-filter preset (every group kept by construction): "
                     + ", ".join(_cell_label(c) for c in left_out) + ".")
    return " ".join(notes)


def filter_pages(sweep: Sweep) -> list[Figure]:
    """Per arm (and condition): how often the filter dropped groups, and which spreads it dropped."""
    shown, left_out = filter_cells(sweep)
    if not shown:
        fig = page(FILTER_TITLE, FILTER_SUBTITLE)
        block(fig, 0.04, 0.85, "No trial to show: every cell's trials failed or none started.")
        return [fig]
    # spread panels only where some trial logged spreads: old sweeps get wider bars instead of blanks
    paired = any(c["kept_std"] is not None or c["dropped_std"] is not None for c in shown)
    col, notes = colors(sweep.arms), _filter_notes(shown, left_out)
    return [_filter_page(shown[i:i + FILTER_CELLS_PER_PAGE], paired, col, notes, continued=i > 0)
            for i in range(0, len(shown), FILTER_CELLS_PER_PAGE)]


def _filter_page(cells: list[dict], paired: bool, col: dict, notes: str, continued: bool) -> Figure:
    fig = page(FILTER_TITLE + (" (continued)" if continued else ""), FILTER_SUBTITLE)
    per = 2 if paired else 1
    # a cell's two panels need a row's width unless four cells share the page
    rows, cols = grid(len(cells), max_cols=1 if paired and len(cells) <= 2 else 2)
    axes = fig.subplots(rows, per * cols, squeeze=False)
    fig.subplots_adjust(top=0.74, bottom=0.2, hspace=0.9, wspace=0.5)
    for i, cell in enumerate(cells):
        r, c = divmod(i, cols)
        _kept_panel(axes[r, per * c], cell, col[cell["arm"]])
        if paired:
            _spread_panel(axes[r, per * c + 1], cell, col[cell["arm"]])
    for ax in list(axes.flat)[per * len(cells):]:
        ax.axis("off")
    block(fig, 0.04, 0.12, notes, size=8, width=190)
    return fig
