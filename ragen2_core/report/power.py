"""Power plan of a study from its no-filter pilots: how many seeds and validation episodes it takes
to see a given difference in final success between two arms.

    ragen2 power doors_pilot_learning [--instance ID] [--tracking-uri URI] [--at-step 40]
                            [--episodes 300] [--seeds 10] [--mde 0.05] [--alpha 0.05] [--power 0.8]

Per pilot cell (arm and settings; seeds pooled): the mean and SD over seeds of `eval/success` at
the last validation (or at `--at-step`, when the study is to be shorter than the pilot), the
per-trial SD at the planned validation size (`--episodes`; see `plan_row`), its 80 % upper
confidence bound (an SD from a few pilot seeds is itself uncertain), the minimum detectable
difference (two-sided t-test at `--alpha`, `--power`) at the planned seeds per arm, and the seeds per
arm that bring it to `--mde`, for the point estimate and for the upper bound. Markdown on stdout.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys

from scipy.stats import chi2

from ragen2_core.report import stats
from ragen2_core.report.analysis import SUCCESS, usable
from ragen2_core.report.archive import BadArchive, open_sweep
from ragen2_core.report.collect import UnknownExperiment, parse_value
from ragen2_core.tracking.mlflow_sink import default_tracking_uri


def seeds_needed(sd: float, target: float, *, alpha: float = 0.05, power: float = 0.8, max_n: int = 10_000) -> int:
    """Fewest trials per arm whose t-corrected minimum detectable difference is <= ``target``."""
    if sd == 0:
        return 2
    for n in range(2, max_n + 1):
        if stats.min_detectable_difference(sd, n, alpha=alpha, power=power, t=True) <= target:
            return n
    raise ValueError(f"more than {max_n} trials per arm are needed for a difference of {target} at sd {sd}")


def sd_upper(sd: float, n: int, level: float = 0.8) -> float:
    """One-sided upper confidence bound of a normal SD estimated from ``n`` values: an SD from a few
    pilot seeds is itself uncertain, and planning with the point estimate underpowers half the time."""
    if n < 2:
        return math.inf
    return float(sd * math.sqrt((n - 1) / chi2.ppf(1 - level, n - 1)))


def trial_sd(seed_sd: float, p: float, n_episodes: int) -> float:
    """Per-trial SD of a success rate measured on ``n_episodes`` validation episodes: the spread
    between seeds plus the binomial noise of the measurement, p (1 - p) / n."""
    return math.sqrt(seed_sd ** 2 + p * (1 - p) / n_episodes)


def seed_sd(total_sd: float, p: float, n_episodes: int) -> float:
    """The part of a measured per-trial SD that is not the validation's binomial noise (trial_sd's
    inverse; 0 when the binomial noise alone explains the spread)."""
    return math.sqrt(max(0.0, total_sd ** 2 - p * (1 - p) / n_episodes))


def plan_row(finals: list[float], pilot_episodes: int, *, episodes: int, seeds: int, mde: float,
             alpha: float, power: float) -> dict:
    """The plan for one cell from its trials' success rates (pure: no MLflow).

    Every trial validates on the same fixed seeds, so the pilot's spread between trials already holds
    the validation noise that a comparison on those seeds meets (less than the binomial p (1 - p) / n
    of fresh episodes: the same hard houses are lost in every trial). At the pilot's validation size
    that spread is the planned trial SD. At another size the spread is split into a part between seeds
    and binomial noise, which is only approximate (`approximate` is then true)."""
    n, p = len(finals), statistics.fmean(finals)
    row = {"n": n, "mean": p, "approximate": episodes != pilot_episodes}
    if n < 2:
        return row | {k: None for k in ("sd", "trial_sd", "trial_sd_upper", "mde", "seeds_needed",
                                        "mde_upper", "seeds_needed_upper")}
    sd = statistics.stdev(finals)
    upper = sd_upper(sd, n)
    if episodes == pilot_episodes:
        planned, planned_upper = sd, upper
    else:
        planned = trial_sd(seed_sd(sd, p, pilot_episodes), p, episodes)
        planned_upper = trial_sd(seed_sd(upper, p, pilot_episodes), p, episodes)
    row |= {"sd": sd, "trial_sd": planned, "trial_sd_upper": planned_upper}
    for name, s in (("", planned), ("_upper", planned_upper)):
        row["mde" + name] = stats.min_detectable_difference(s, seeds, alpha=alpha, power=power, t=True)
        row["seeds_needed" + name] = seeds_needed(s, mde, alpha=alpha, power=power)
    return row


def at_step(trial, step: int | None):
    """Success at the trial's last validation, or at ``step`` (None when it was not validated then)."""
    if step is None:
        return trial.final(SUCCESS)
    return dict(zip(*trial.curve(SUCCESS))).get(step)


def _pts(x) -> str:
    return stats.DASH if x is None else f"{100 * x:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", help="the pilot sweep (MLflow experiment, or its archive *.json.gz)")
    ap.add_argument("--instance", help="sweep instance (default: the latest)")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    ap.add_argument("--at-step", type=int, help="read success at this step (default: each trial's last validation)")
    ap.add_argument("--episodes", type=int, default=300, help="planned validation episodes per trial")
    ap.add_argument("--seeds", type=int, default=10, help="planned seeds per arm")
    ap.add_argument("--mde", type=float, default=0.05, help="target minimum detectable difference (0.05 = 5 points)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--power", type=float, default=0.8)
    args = ap.parse_args(argv)
    bad = [f"--{k} {v}: must be in (0, 1)" for k, v in (("mde", args.mde), ("alpha", args.alpha),
                                                         ("power", args.power)) if not 0 < v < 1]
    if args.episodes < 1:
        bad.append(f"--episodes {args.episodes}: must be >= 1")
    if args.seeds < 2:
        bad.append(f"--seeds {args.seeds}: must be >= 2 (a t-test needs two per arm)")
    if args.at_step is not None and args.at_step < 1:
        bad.append(f"--at-step {args.at_step}: must be a validated step, >= 1")
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 2
    try:
        sweep = open_sweep(args.experiment, args.tracking_uri or default_tracking_uri(), instance=args.instance)
    except (UnknownExperiment, BadArchive, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    validated = sorted({s for t in sweep.trials for s in t.curve(SUCCESS)[0]})
    if args.at_step is not None and args.at_step not in validated:
        print(f"--at-step {args.at_step}: no trial of {sweep.experiment} was validated then; it validated at "
              f"steps {', '.join(map(str, validated)) or 'none'}", file=sys.stderr)
        return 2
    when = f"at step {args.at_step}" if args.at_step else "at the last validation"
    print(f"Power plan from `{args.experiment}` (`{SUCCESS}` {when}): {args.seeds} seeds per arm, "
          f"{args.episodes} validation episodes per trial, two-sided t-test at {args.alpha}, power {args.power}; "
          f"target difference {100 * args.mde:.1f} points. SDs and differences in points.\n")
    print("| arm | settings | pilot trials | pilot episodes | mean | SD | trial SD at plan "
          "(80 % upper) | MDE at plan (upper) | seeds for the target (upper) |")
    print("|" + " --- |" * 9)
    for arm in sweep.arms:
        for cond in sweep.conditions or ["all"]:
            trials = [t for t in sweep.cell(arm, cond) if usable(t, False)]
            if not trials:
                continue
            pilot_eps = {parse_value(t.params.get("env.val_seeds", "")) for t in trials}
            if len(pilot_eps) != 1 or not isinstance(next(iter(pilot_eps)), int):
                print(f"{arm} {cond}: trials disagree on env.val_seeds ({pilot_eps}); skipped", file=sys.stderr)
                continue
            eps = pilot_eps.pop()
            values = [at_step(t, args.at_step) for t in trials]
            values = [v for v in values if v is not None]
            if not values:
                print(f"{arm} {cond}: no validation at step {args.at_step}; skipped", file=sys.stderr)
                continue
            r = plan_row(values, eps, episodes=args.episodes, seeds=args.seeds,
                         mde=args.mde, alpha=args.alpha, power=args.power)
            mark = " (approx.)" if r["approximate"] else ""
            print(f"| {arm} | {cond} | {r['n']} | {eps} | {_pts(r['mean'])} | {_pts(r['sd'])} | "
                  f"{_pts(r['trial_sd'])} ({_pts(r['trial_sd_upper'])}){mark} | {_pts(r['mde'])} ({_pts(r['mde_upper'])}) | "
                  f"{r['seeds_needed'] or stats.DASH} ({r['seeds_needed_upper'] or stats.DASH}) |")
    return 0

