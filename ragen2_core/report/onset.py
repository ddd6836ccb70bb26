"""Did a run collapse, and when? The criterion of docs/reproduction.md Part 3, fixed before its pilots.

Per-step readings are noisy (64 rollouts a step, 8 x 4 reasonings an MI reading), so both signals
are smoothed first: the template share over windows of 4 consecutive logged steps, MI over pairs of
consecutive readings. A run *collapses* at the first window whose template share is at least `rise`
above the lowest earlier window, or the first pair whose MI is at least `fall` below the highest
earlier pair, while validation success is below `ceiling` (a policy that has solved the task may
write what it likes). Success is read at the last validation at or before the window's end; before
the first validation the run counts as below the ceiling (every setting here starts far below it).

    from ragen2_core.report.onset import collapse_onset
    o = collapse_onset(trial.curve("rollout/template_frac"), trial.curve("collapse/mi"),
                       trial.curve("eval/success"))
    o.collapsed, o.signal, o.step, o.template_rise, o.mi_fall
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Curve = tuple[list[int], list[float]]  # (steps, values), as Trial.curve returns

RISE, FALL, CEILING = 0.2, 0.3, 0.9
TEMPLATE_WINDOW, MI_WINDOW = 4, 2


@dataclass(frozen=True)
class Onset:
    collapsed: bool
    signal: str | None          # "template" or "mi": which crossed first (template on a tie)
    step: int | None            # the last step of the window where it crossed
    template_rise: float        # the largest rise of a window above the lowest earlier one (nan: < 2 windows)
    mi_fall: float              # the largest fall of a pair below the highest earlier one (nan: < 2 pairs)


def windows(curve: Curve, width: int) -> list[tuple[int, float]]:
    """(last step, mean) of consecutive windows of ``width`` logged values, NaNs left out; a last,
    shorter window is dropped (its mean would be noisier than the rest)."""
    steps, values = curve
    out = []
    for i in range(0, len(values) - width + 1, width):
        chunk = [v for v in values[i:i + width] if not math.isnan(v)]
        if chunk:
            out.append((steps[i + width - 1], sum(chunk) / len(chunk)))
    return out


def _success_at(success: Curve, step: int) -> float:
    seen = [v for s, v in zip(*success) if s <= step]
    return seen[-1] if seen else 0.0


def _first_crossing(points: list[tuple[int, float]], sign: int, size: float, success: Curve, ceiling: float):
    """(step of the first point at least ``size`` beyond the extreme of the earlier points in
    direction ``sign`` (+1: above the lowest, -1: below the highest) while below the ceiling, the
    largest such excursion)."""
    first, largest, extreme = None, float("nan"), None
    for step, v in points:
        if extreme is not None:
            move = sign * (v - extreme)
            largest = move if math.isnan(largest) else max(largest, move)
            if first is None and move >= size - 1e-12 and _success_at(success, step) < ceiling:
                first = step
        extreme = v if extreme is None else (min(extreme, v) if sign > 0 else max(extreme, v))
    return first, largest


def collapse_onset(template: Curve, mi: Curve, success: Curve, *, rise: float = RISE, fall: float = FALL,
                   ceiling: float = CEILING) -> Onset:
    t_step, t_rise = _first_crossing(windows(template, TEMPLATE_WINDOW), +1, rise, success, ceiling)
    m_step, m_fall = _first_crossing(windows(mi, MI_WINDOW), -1, fall, success, ceiling)
    crossings = [(s, name) for s, name in ((t_step, "template"), (m_step, "mi")) if s is not None]
    step, signal = min(crossings, key=lambda c: (c[0], c[1] != "template")) if crossings else (None, None)
    return Onset(collapsed=step is not None, signal=signal, step=step, template_rise=t_rise, mi_fall=m_fall)


def success_fall_step(success: Curve, *, drop: float = 0.05) -> int | None:
    """The first validation at least ``drop`` below the best earlier one, or None. Validation (the
    same fixed episodes every time, 1,000 in the Part 3 study) is the precise reading of success;
    training success over a few steps swings by half at rates near 0.15."""
    best = None
    for step, v in zip(*success):
        if best is not None and v <= best - drop:
            return step
        best = v if best is None else max(best, v)
    return None


def failure_step(template: Curve, eval_success: Curve) -> int | None:
    """When a run's collapse showed in behaviour: the earlier of the template share's rise
    (``collapse_onset``'s template criterion) and validation success falling below its best."""
    t = collapse_onset(template, ([], []), eval_success)
    steps = [s for s in (t.step, success_fall_step(eval_success)) if s is not None]
    return min(steps) if steps else None


def _mean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def _f(x: float, digits: int = 2) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def cell_label(trial) -> str:
    """A trial's arm, and its condition where the sweep varied more than arms."""
    return trial.arm if trial.condition == "all" else f"{trial.arm} {trial.condition}"


def trial_rows(sweep) -> list[str]:
    """One Markdown row per trial (running ones too, marked): how its template share and MI moved,
    its validations, how much the filter kept and how many groups had no spread, and the verdict."""
    rows = ["| arm | seed | steps | template share: first → lowest → last window (largest rise) | "
            "MI: first → highest → last pair, nats (largest fall) | validation success | kept fraction | "
            "zero-spread groups, last quarter | entropy: first → last 10 steps | collapsed |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in sorted(sweep.trials, key=lambda t: (sweep.arms.index(t.arm), t.condition, str(t.seed))):
        template, mi, success = t.curve("rollout/template_frac"), t.curve("collapse/mi"), t.curve("eval/success")
        o = collapse_onset(template, mi, success)
        tw, mw = [v for _, v in windows(template, TEMPLATE_WINDOW)], [v for _, v in windows(mi, MI_WINDOW)]
        zero, entropy = t.curve("rollout/frac_zero_std_groups")[1], t.curve("actor/entropy")[1]
        verdict = f"**yes**: {o.signal} at step {o.step}" if o.collapsed else "no"
        status = "" if t.status == "FINISHED" else f" ({t.status.lower()})"
        rows.append(
            f"| {cell_label(t)} | {t.seed} | {t.last_step()}{status} | "
            f"{_f(tw[0]) if tw else '-'} → {_f(min(tw)) if tw else '-'} → {_f(tw[-1]) if tw else '-'} "
            f"({_f(o.template_rise)}) | "
            f"{_f(mw[0]) if mw else '-'} → {_f(max(mw)) if mw else '-'} → {_f(mw[-1]) if mw else '-'} ({_f(o.mi_fall)}) | "
            f"{' '.join(f'{100 * v:.1f}' for v in success[1]) or '-'} | "
            f"{_f(_mean(t.curve('filter/kept_ratio')[1]))} | {_f(_mean(zero[-max(1, len(zero) // 4):]) if zero else float('nan'))} | "
            f"{_f(_mean(entropy[:10]), 3)} → {_f(_mean(entropy[-10:]), 3)} | {verdict} |")
    return rows


def curve_rows(sweep, metric: str, width: int) -> list[str]:
    """One Markdown row per trial: ``metric``'s mean over each window of ``width`` logged steps (the
    windows of `windows`, named by their first and last step), for curves no column above shows."""
    rows = [f"| arm | seed | `{metric}`, mean of each {width} logged steps |", "| --- | --- | --- |"]
    for t in sorted(sweep.trials, key=lambda t: (sweep.arms.index(t.arm), t.condition, str(t.seed))):
        steps = t.curve(metric)[0]
        cells = [f"{steps[steps.index(last) - width + 1]}-{last}: {_f(mean, 3)}"
                 for last, mean in windows(t.curve(metric), width)]
        rows.append(f"| {cell_label(t)} | {t.seed} | "
                    f"{', '.join(cells) or '-'} |")
    return rows
