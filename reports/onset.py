"""Per trial of a sweep: did it collapse by the criterion of docs/reproduction.md Part 3, and how
its template share, MI, validation success, kept fraction and zero-spread share moved. Running
trials are included (marked), so a sweep can be watched while it runs.

    python reports/onset.py p1_shaped [p2_template_kl ...] [--tracking-uri URI]
    python reports/onset.py docs/data/mechanism/p1_shaped.json.gz
    python reports/onset.py --alarms docs/data/mechanism/*.json.gz     # monitors' lead times, pooled
    python reports/onset.py --scan docs/data/mechanism/shaped_vs_filter.json.gz  # every threshold
    python reports/onset.py --calibrate-on docs/data/mechanism/shaped_vs_filter.json.gz \
        docs/data/mechanism/shaped_*.json.gz          # thresholds picked on one sweep, judged on the rest
    python reports/onset.py --alarms --per-trial X.json.gz   # and the step each monitor fired, per trial
    python reports/onset.py p3_long.json.gz --curve actor/entropy --window 10   # any curve, windowed

With --alarms, also the three preset monitors (`alarms.ALARMS`) over the finished trials of all the
sweeps named: how many collapses each caught before they showed in behaviour, by how many steps,
how many it missed, and how often it fired in trials that did not collapse. --scan does the same for
every threshold of every family in `alarms.SCANS`. --calibrate-on picks one threshold per family on
the finished trials of the sweeps it names (`alarms.calibrate`) and judges it on those of the other
sweeps named (a sweep named both ways counts only as calibration). --per-trial adds, under
--alarms and --calibrate-on, one row per trial behind those counts: the step its collapse showed
and the step each monitor fired. With --curve, also one metric's mean over consecutive windows of
--window logged steps, per trial.

Exit status: 0 printed; 2 an unknown experiment, a bad archive, or a --curve no trial logged (the nearest names said).
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report.archive import BadArchive, open_sweep  # noqa: E402
from ragen2_core.report.collect import UnknownExperiment  # noqa: E402
from ragen2_core.report.alarms import (ALARMS, alarm_rows, held_out_rows, picked_alarms,  # noqa: E402
                                       scan_rows, trial_alarm_rows)
from ragen2_core.report.onset import curve_rows, trial_rows  # noqa: E402
from ragen2_core.tracking.mlflow_sink import default_tracking_uri  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="sweep names (MLflow experiments) or archives (*.json.gz)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--alarms", action="store_true", help="also the monitors' lead times over all finished trials")
    parser.add_argument("--scan", action="store_true", help="also every threshold of every monitor family")
    parser.add_argument("--calibrate-on", action="append", default=[], metavar="SWEEP",
                        help="pick each family's threshold on this sweep (repeatable), judge it on the others")
    parser.add_argument("--per-trial", action="store_true",
                        help="with --alarms or --calibrate-on: the step each monitor fired, per trial")
    parser.add_argument("--curve", metavar="METRIC", help="also this metric's windowed means per trial, e.g. actor/entropy")
    parser.add_argument("--window", type=int, default=10, help="logged steps per --curve window (default 10)")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window {args.window}: must be at least 1 logged step, e.g. --window 10")
    uri = args.tracking_uri or default_tracking_uri()
    opened = {}

    def read(name):  # a sweep named twice (as calibration and in a glob) is read once
        if name not in opened:
            opened[name] = open_sweep(name, uri)
        return opened[name]

    try:  # every sweep opened before anything is printed
        calibration = [read(n) for n in args.calibrate_on]
        named = [read(n) for n in args.experiments]
        for sweep in named if args.curve else []:
            logged = {m for t in sweep.trials for m in t.history}
            if args.curve not in logged:
                near = difflib.get_close_matches(args.curve, sorted(logged), n=3, cutoff=0.6)
                raise ValueError(f"--curve {args.curve!r}: no trial of {sweep.experiment} logged it; "
                                 + (f"did you mean {', '.join(near)}?" if near else
                                    f"it logged {', '.join(sorted(logged))}"))
    except (UnknownExperiment, BadArchive, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    finished = []
    for sweep in named:
        print(f"### {sweep.experiment}\n")
        print("\n".join(trial_rows(sweep)) + "\n")
        if args.curve:
            print("\n".join(curve_rows(sweep, args.curve, args.window)) + "\n")
        finished += [(sweep.experiment, t) for t in sweep.trials if t.status == "FINISHED"]
    if args.alarms:
        print(f"### Preset monitors over {len(finished)} finished trials\n")
        print("\n".join(alarm_rows([t for _, t in finished])) + "\n")
        if args.per_trial:
            print("\n".join(trial_alarm_rows(finished, ALARMS)) + "\n")
    if args.scan:
        print(f"### Every threshold over {len(finished)} finished trials\n")
        print("\n".join(scan_rows([t for _, t in finished])) + "\n")
    if calibration:
        picked_on = {s.experiment for s in calibration}
        cal = [t for s in calibration for t in s.trials if t.status == "FINISHED"]
        held = [(name, t) for name, t in finished if name not in picked_on]
        print(f"### Thresholds picked on {', '.join(sorted(picked_on))} ({len(cal)} finished trials), "
              f"judged on {len(held)} held-out finished trials\n")
        print("\n".join(held_out_rows(cal, [t for _, t in held])) + "\n")
        if args.per_trial:
            print("\n".join(trial_alarm_rows(held, picked_alarms(cal))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
