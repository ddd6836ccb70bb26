"""Power plan of a study from its no-filter pilots: how many seeds and validation episodes it takes
to see a given difference in final success between two arms.

    python reports/power.py doors_pilots [--instance ID] [--tracking-uri URI]
                            [--episodes 300] [--seeds 10] [--mde 0.05] [--alpha 0.05] [--power 0.8]

Per pilot cell (arm and settings; seeds pooled): the mean and SD over seeds of the final
`eval/success`, split into the spread between seeds and the binomial noise of the pilot's own
validation size, then the per-trial SD at the planned validation size (`--episodes`), its 80 %
upper confidence bound (an SD from a few pilot seeds is itself uncertain), the minimum detectable
difference (two-sided t-test at `--alpha`, `--power`) at the planned seeds per arm, and the seeds per
arm that bring it to `--mde`, for the point estimate and for the upper bound. Markdown on stdout.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report import stats  # noqa: E402
from ragen2_core.report.analysis import SUCCESS, usable  # noqa: E402
from ragen2_core.report.collect import UnknownExperiment, collect, parse_value  # noqa: E402
from ragen2_core.tracking.mlflow_sink import default_tracking_uri  # noqa: E402


def plan_row(finals: list[float], pilot_episodes: int, *, episodes: int, seeds: int, mde: float,
             alpha: float, power: float) -> dict:
    """The plan for one cell from its trials' final success rates (pure: no MLflow)."""
    n, p = len(finals), statistics.fmean(finals)
    sd = statistics.stdev(finals) if n > 1 else float("nan")
    between = stats.seed_sd(sd, p, pilot_episodes) if n > 1 else float("nan")
    planned = stats.trial_sd(between, p, episodes) if n > 1 else float("nan")
    upper = stats.trial_sd(stats.sd_upper(between, n), p, episodes) if n > 1 else float("nan")
    row = {"n": n, "mean": p, "sd": sd, "seed_sd": between, "trial_sd": planned, "trial_sd_upper": upper}
    for name, s in (("", planned), ("_upper", upper)):
        ok = n > 1 and s == s
        row["mde" + name] = stats.min_detectable_difference(s, seeds, alpha=alpha, power=power, t=True) if ok else None
        row["seeds_needed" + name] = stats.seeds_needed(s, mde, alpha=alpha, power=power) if ok else None
    return row


def _pts(x) -> str:
    return stats.DASH if x is None or x != x else f"{100 * x:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", help="the pilot sweep (MLflow experiment)")
    ap.add_argument("--instance", help="sweep instance (default: the latest)")
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    ap.add_argument("--episodes", type=int, default=300, help="planned validation episodes per trial")
    ap.add_argument("--seeds", type=int, default=10, help="planned seeds per arm")
    ap.add_argument("--mde", type=float, default=0.05, help="target minimum detectable difference (0.05 = 5 points)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--power", type=float, default=0.8)
    args = ap.parse_args(argv)
    bad = [f"--episodes {args.episodes}: must be >= 1" for _ in [0] if args.episodes < 1]
    bad += [f"--seeds {args.seeds}: must be >= 2 (an SD needs two)" for _ in [0] if args.seeds < 2]
    bad += [f"--{k} {v}: must be in (0, 1)" for k, v in (("mde", args.mde), ("alpha", args.alpha),
                                                          ("power", args.power)) if not 0 < v < 1]
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 2
    try:
        sweep = collect(args.tracking_uri or default_tracking_uri(), args.experiment, instance=args.instance)
    except UnknownExperiment as e:
        print(e, file=sys.stderr)
        return 2
    print(f"Power plan from `{args.experiment}` (final `{SUCCESS}`): {args.seeds} seeds per arm, "
          f"{args.episodes} validation episodes per trial, two-sided t-test at {args.alpha}, power {args.power}; "
          f"target difference {100 * args.mde:.1f} points. SDs and differences in points.\n")
    print("| arm | settings | pilot trials | pilot episodes | mean | SD | seed SD | trial SD at plan "
          "(80 % upper) | MDE at plan (upper) | seeds for the target (upper) |")
    print("|" + " --- |" * 10)
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
            r = plan_row([t.final(SUCCESS) for t in trials], eps, episodes=args.episodes, seeds=args.seeds,
                         mde=args.mde, alpha=args.alpha, power=args.power)
            print(f"| {arm} | {cond} | {r['n']} | {eps} | {_pts(r['mean'])} | {_pts(r['sd'])} | {_pts(r['seed_sd'])} | "
                  f"{_pts(r['trial_sd'])} ({_pts(r['trial_sd_upper'])}) | {_pts(r['mde'])} ({_pts(r['mde_upper'])}) | "
                  f"{r['seeds_needed'] or stats.DASH} ({r['seeds_needed_upper'] or stats.DASH}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
