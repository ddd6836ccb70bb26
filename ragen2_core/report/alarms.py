"""Collapse monitors judged against behaviour: did a monitor fire before a run's collapse showed
(`onset.failure_step`), by how many steps, and how often did it fire in runs that did not collapse?

A monitor (`Alarm`) watches one logged signal and fires at the first of ``patience`` readings in a
row beyond a threshold: below an absolute level, or below a fraction of the highest earlier reading
(``rising=True``: above the level, or above a multiple of the lowest earlier reading). `ALARMS` are
the three fixed before the Part 3 study (docs/reproduction.md); `SCANS` are families of thresholds
for asking which threshold would have caught the collapses, and `calibrate` is the rule, fixed
before the held-out sweeps ran, that picks one threshold per family on some trials so that it can
be judged on others.

    from ragen2_core.report.alarms import ALARMS, alarm_rows, calibrate, SCANS
    print("\\n".join(alarm_rows(trials)))                   # the preset monitors
    chosen = {name: calibrate(trials, name) for name in SCANS}
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from ragen2_core.report.onset import Curve, cell_label, failure_step, windows


@dataclass(frozen=True)
class Alarm:
    metric: str
    level: float | None = None
    relative: float | None = None
    patience: int = 3
    window: int = 1             # average this many consecutive logged values first (per-step signals)
    rising: bool = False        # watch for a rise instead of a fall


# Fixed before the Part 3 study ran (docs/reproduction.md): the shipped alert, the release's
# statistic with a relative threshold (an effect size has no absolute scale), and the usual
# entropy-collapse monitor.
ALARMS = (Alarm("collapse/mi_perm_zscore_ema", level=2.0),
          Alarm("collapse/mi_zscore_ema", relative=0.5),
          Alarm("actor/entropy", relative=0.5, window=4))

# Threshold families, strictest first (the first fires least often). Patience stays at the presets'
# 3 readings: only the threshold is asked about. A rising-entropy family is there because entropy
# rose, not fell, in the collapses of shaped_vs_filter; it is labelled as found after the fact.
SCANS = {
    "permutation z-score EMA, absolute": [Alarm("collapse/mi_perm_zscore_ema", level=x)
                                          for x in (1.0, 2.0, 3.0, 3.5, 4.0, 4.5, 5.0)],
    "permutation z-score EMA, relative": [Alarm("collapse/mi_perm_zscore_ema", relative=r)
                                          for r in (0.5, 0.7, 0.8, 0.85, 0.9, 0.95)],
    "release z-score EMA, relative": [Alarm("collapse/mi_zscore_ema", relative=r)
                                      for r in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)],
    "MI (pairs of readings), relative": [Alarm("collapse/mi", relative=r, window=2)
                                         for r in (0.5, 0.6, 0.7, 0.8, 0.9)],
    "entropy falling (4-step windows), relative": [Alarm("actor/entropy", relative=r, window=4)
                                                   for r in (0.5, 0.6, 0.7, 0.8, 0.9)],
    "entropy rising (4-step windows), relative (after the fact)": [
        Alarm("actor/entropy", relative=r, window=4, rising=True) for r in (2.0, 1.5, 1.3, 1.2, 1.1)],
}


def alarm_step(curve: Curve, alarm: Alarm) -> int | None:
    """The step at which ``alarm`` fires on ``curve``, or None."""
    points = windows(curve, alarm.window) if alarm.window > 1 else list(zip(*curve))
    sign = -1 if alarm.rising else 1            # compare -v against -threshold: one code path for both
    run, extreme = 0, None                      # the highest earlier reading (lowest when rising)
    for step, v in points:
        if math.isnan(v):
            continue
        beyond = (alarm.level is not None and sign * v < sign * alarm.level) or (
            alarm.relative is not None and extreme is not None and sign * v < sign * alarm.relative * extreme)
        run = run + 1 if beyond else 0
        if run >= alarm.patience:
            return step
        extreme = v if extreme is None else (max(extreme, v) if sign > 0 else min(extreme, v))
    return None


def alarm_summary(trials, alarms=ALARMS) -> list[dict]:
    """Per alarm, over ``trials``: lead times (failure step minus alarm step) of the collapsed trials
    it caught in time, how many collapsed trials it missed (no alarm, or one after the failure), and
    how many of the trials that did not collapse it fired in (false alarms)."""
    failed = {id(t): failure_step(t.curve("rollout/template_frac"), t.curve("eval/success")) for t in trials}
    out = []
    for alarm in alarms:
        leads, missed, false, quiet = [], 0, 0, 0
        for t in trials:
            fired, fail = alarm_step(t.curve(alarm.metric), alarm), failed[id(t)]
            if fail is None:
                quiet += 1
                false += fired is not None
            elif fired is not None and fired <= fail:
                leads.append(fail - fired)
            else:
                missed += 1
        out.append({"alarm": alarm, "collapsed": len(leads) + missed, "caught": len(leads), "leads": leads,
                    "missed": missed, "quiet": quiet, "false_alarms": false})
    return out


def calibrate(trials, family: str, *, max_false: float = 0.1) -> dict | None:
    """The rule fixed before the held-out sweeps: of ``family``'s thresholds whose false alarms on
    ``trials`` are at most ``max_false`` of the trials that did not collapse, the one that caught
    the most collapses in time; ties go to the longer median lead, then to the stricter threshold.
    None when no threshold catches anything within that false-alarm budget."""
    best, best_key = None, None
    for rank, r in enumerate(alarm_summary(trials, SCANS[family])):
        if r["caught"] == 0 or r["false_alarms"] > max_false * r["quiet"]:
            continue
        key = (r["caught"], median(r["leads"]), -rank)
        if best_key is None or key > best_key:
            best, best_key = r, key
    return best


def describe_alarm(a: Alarm) -> str:
    op, ref = (">", "lowest") if a.rising else ("<", "highest")
    level = f"{op} {a.level:g}" if a.level is not None else f"{op} {a.relative:g} x its {ref} earlier reading"
    over = f" ({a.window}-step windows)" if a.window > 1 and a.metric == "actor/entropy" else (
        f" (means of {a.window} readings)" if a.window > 1 else "")
    return f"`{a.metric}`{over} {level}, {a.patience} in a row"


def summary_cells(r: dict) -> list[str]:
    """An `alarm_summary` entry as table cells: caught in time, lead (median, range), missed, false alarms."""
    leads = r["leads"]
    lead = f"{median(leads):g} ({min(leads)}-{max(leads)})" if leads else "-"
    return [f"{r['caught']} of {r['collapsed']}", lead, str(r["missed"]), f"{r['false_alarms']} of {r['quiet']}"]


def _cells(r: dict) -> str:
    return " | ".join(summary_cells(r)) + " |"


def _row(label: str, r: dict) -> str:
    return f"| {label} | {_cells(r)}"


_HEAD = ["| monitor | collapsed trials caught in time | lead time, steps (median, range) | missed | "
         "false alarms (trials that did not collapse) |", "| --- | --- | --- | --- | --- |"]


def alarm_rows(trials, alarms=ALARMS) -> list[str]:
    return _HEAD + [_row(describe_alarm(r["alarm"]), r) for r in alarm_summary(trials, alarms)]


def scan_rows(trials) -> list[str]:
    """Every threshold of every family in `SCANS` over ``trials``: the whole trade-off, strictest first."""
    return _HEAD + [_row(f"{family}: {describe_alarm(r['alarm'])}", r)
                    for family, alarms in SCANS.items() for r in alarm_summary(trials, alarms)]


def _fired_cell(fired: int | None, fail: int | None) -> str:
    if fired is None:
        return "-" if fail is None else "missed"
    if fail is None:
        return f"{fired} (false alarm)"
    return f"{fired} (lead {fail - fired})" if fired <= fail else f"{fired} (late)"


def trial_alarm_rows(labelled, alarms) -> list[str]:
    """One row per (label, trial) of ``labelled``: the step at which its collapse showed in behaviour
    (`failure_step`) and the step at which each of ``alarms`` fired, so that every count of
    `alarm_summary` can be traced to the trials behind it."""
    rows = ["| sweep | arm | seed | collapse showed at step | " + " | ".join(describe_alarm(a) for a in alarms) + " |",
            "| --- " * (4 + len(alarms)) + "|"]
    for label, t in sorted(labelled, key=lambda lt: (lt[0], lt[1].arm, lt[1].condition, str(lt[1].seed))):
        fail = failure_step(t.curve("rollout/template_frac"), t.curve("eval/success"))
        cells = [_fired_cell(alarm_step(t.curve(a.metric), a), fail) for a in alarms]
        rows.append(f"| {label} | {cell_label(t)} | {t.seed} | {'-' if fail is None else fail} | " + " | ".join(cells) + " |")
    return rows


def picked_alarms(calibration) -> list[Alarm]:
    """The threshold `calibrate` picks per family of `SCANS` on ``calibration`` (families with none left out)."""
    return [r["alarm"] for r in (calibrate(calibration, family) for family in SCANS) if r is not None]


def held_out_rows(calibration, held_out) -> list[str]:
    """Per family: the threshold `calibrate` picks on ``calibration``, and how it does there and on
    ``held_out`` (trials it was not picked on)."""
    rows = ["| family | threshold picked | on the calibration trials: caught, lead, false alarms | "
            "held out: caught in time | lead time, steps (median, range) | missed | false alarms |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for family in SCANS:
        picked = calibrate(calibration, family)
        if picked is None:
            rows.append(f"| {family} | none catches a collapse within the false-alarm budget | - | - | - | - | - |")
            continue
        (test,) = alarm_summary(held_out, (picked["alarm"],))
        cal = (f"{picked['caught']} of {picked['collapsed']}, {median(picked['leads']):g}, "
               f"{picked['false_alarms']} of {picked['quiet']}")
        rows.append(f"| {family} | {describe_alarm(picked['alarm'])} | {cal} | {_cells(test)}")
    return rows
