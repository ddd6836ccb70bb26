"""The report's monitor page: did the collapse monitors fire before each collapse showed in
behaviour (`onset.failure_step`), and what would other thresholds have caught, at what false-alarm
rate, on this sweep.

    from ragen2_core.report.monitor_figures import monitor_pages
    pages = monitor_pages(sweep)          # a list with one matplotlib figure
"""
from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from ragen2_core.report.alarms import ALARMS, SCANS, alarm_step, alarm_summary, describe_alarm, summary_cells
from ragen2_core.report.collect import Sweep
from ragen2_core.report.figures import block, page, table
from ragen2_core.report.onset import failure_step

TEMPLATE, SUCCESS = "rollout/template_frac", "eval/success"
TITLE = "Collapse monitors: did they fire before the collapse showed?"
SUBTITLE = ("A finished trial collapsed at the first step its template share rose 0.2 above its lowest 4-step "
            "window, or a validation fell 5 points below the best earlier one (docs/reproduction.md Part 3). "
            "A monitor caught the collapse when it fired at or before that step; it raised a false alarm when it "
            "fired in a trial that did not collapse.")
MAX_ROWS = 24          # collapsed trials drawn on the timeline, earliest failures first
MARKERS = ("o", "s", "^")


def monitor_pages(sweep: Sweep) -> list[Figure]:
    trials = [t for t in sweep.trials if t.status == "FINISHED"]
    fig = page(TITLE, SUBTITLE)
    if not any(t.curve(TEMPLATE)[0] for t in trials):
        block(fig, 0.04, 0.8, f"No finished trial logged {TEMPLATE}, so when (or whether) a trial collapsed "
                              "cannot be read, and the monitors cannot be judged.")
        return [fig]
    failed = {id(t): failure_step(t.curve(TEMPLATE), t.curve(SUCCESS)) for t in trials}
    collapsed = sorted((t for t in trials if failed[id(t)] is not None), key=lambda t: failed[id(t)])
    quiet = len(trials) - len(collapsed)
    header = ["preset monitor (fixed before the study)", "collapses caught in time", "lead, steps (median, range)",
              "missed", "false alarms"]
    preset = alarm_summary(trials)
    rows = [[describe_alarm(r["alarm"]).replace("`", ""), *summary_cells(r)] for r in preset]
    table(fig.add_axes([0.04, 0.7, 0.92, 0.12]), header, rows, size=8)
    _tradeoff(fig.add_axes([0.07, 0.17, 0.36, 0.43]), trials, preset, len(collapsed), quiet)
    _timeline(fig.add_axes([0.58, 0.17, 0.38, 0.43]), collapsed, failed)
    block(fig, 0.04, 0.08, f"{len(collapsed)} of {len(trials)} finished trials collapsed. Left: every threshold of "
          "each family in report/alarms.py SCANS on this sweep, strictest first along each line; read off the "
          "same trials, so it flatters every monitor (python reports/onset.py --calibrate-on SWEEP picks "
          "thresholds on one sweep and judges them on others, and --scan prints these numbers).",
          size=8, width=190)
    return [fig]


def _tradeoff(ax, trials, preset: list[dict], n_collapsed: int, n_quiet: int) -> None:
    ax.set_title("every threshold: collapses caught vs false alarms", fontsize=9)
    if not n_collapsed or not n_quiet:
        ax.axis("off")
        ax.text(0.5, 0.5, f"needs trials that collapsed and trials that did not\n(here {n_collapsed} and {n_quiet})",
                ha="center", va="center", transform=ax.transAxes, fontsize=8)
        return
    cmap = matplotlib.colormaps["tab10"]
    for i, (family, alarms) in enumerate(SCANS.items()):
        rs = alarm_summary(trials, alarms)
        ax.plot([r["false_alarms"] / n_quiet for r in rs], [r["caught"] / n_collapsed for r in rs], marker=".",
                color=cmap(i), label=family, alpha=0.8)
    for r, marker in zip(preset, MARKERS):
        ax.scatter([r["false_alarms"] / n_quiet], [r["caught"] / n_collapsed], marker=marker, s=70,
                   facecolors="none", edgecolors="black", zorder=3, label=f"preset: {r['alarm'].metric}")
    ax.set_xlim(-0.04, 1.04)
    ax.set_ylim(-0.04, 1.04)
    ax.set_xlabel(f"false-alarm rate (of {n_quiet} trials that did not collapse)", fontsize=8)
    ax.set_ylabel(f"caught in time (of {n_collapsed} collapsed trials)", fontsize=8)
    ax.legend(fontsize=5.5, loc="lower right")


def _timeline(ax, collapsed, failed: dict) -> None:
    ax.set_title("collapsed trials: when it showed (|) and when each preset monitor fired", fontsize=9)
    if not collapsed:
        ax.axis("off")
        ax.text(0.5, 0.5, "no trial collapsed", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        return
    shown, labelled = collapsed[:MAX_ROWS], set()
    for y, t in enumerate(shown):
        ax.plot([0, t.last_step() or 0], [y, y], color="0.85", lw=1, zorder=0)
        ax.scatter([failed[id(t)]], [y], marker="|", s=120, color="black", zorder=3,
                   label="collapse showed" if y == 0 else None)
        for i, (alarm, marker) in enumerate(zip(ALARMS, MARKERS)):
            fired = alarm_step(t.curve(alarm.metric), alarm)
            if fired is not None:
                ax.scatter([fired], [y], marker=marker, s=22, color=matplotlib.colormaps["Dark2"](i), zorder=2,
                           label=None if alarm.metric in labelled else alarm.metric)
                labelled.add(alarm.metric)
    ax.set_yticks(range(len(shown)), [" ".join(str(x) for x in (t.arm, t.condition, t.seed) if x != "all")
                                      for t in shown], fontsize=5.5)
    ax.invert_yaxis()
    ax.set_xlabel("training step" + (f" (first {MAX_ROWS} of {len(collapsed)} collapsed trials)"
                                     if len(collapsed) > MAX_ROWS else ""), fontsize=8)
    ax.legend(fontsize=6, loc="lower right")
