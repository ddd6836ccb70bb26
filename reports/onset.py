"""Per trial of a sweep: did it collapse by the criterion of docs/reproduction.md Part 3, and how
its template share, MI, validation success, kept fraction and zero-spread share moved. Running
trials are included (marked), so a sweep can be watched while it runs.

    python reports/onset.py p1_shaped [p2_template_kl ...] [--tracking-uri URI]
    python reports/onset.py docs/data/mechanism/p1_shaped.json.gz
    python reports/onset.py --alarms docs/data/mechanism/*.json.gz     # monitors' lead times, pooled
    python reports/onset.py p3_long.json.gz --curve actor/entropy --window 10   # any curve, windowed

With --alarms, also the three monitors of `ALARMS` over the finished trials of all the sweeps named:
how many collapses each caught before they showed in behaviour, by how many steps, how many it
missed, and how often it fired in trials that did not collapse. With --curve, also one metric's
mean over consecutive windows of --window logged steps, per trial.

Exit status: 0 printed; 2 an unknown experiment or a bad archive.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report.archive import BadArchive, open_sweep  # noqa: E402
from ragen2_core.report.collect import UnknownExperiment  # noqa: E402
from ragen2_core.report.onset import alarm_rows, curve_rows, trial_rows  # noqa: E402
from ragen2_core.tracking.mlflow_sink import default_tracking_uri  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="sweep names (MLflow experiments) or archives (*.json.gz)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--alarms", action="store_true", help="also the monitors' lead times over all finished trials")
    parser.add_argument("--curve", metavar="METRIC", help="also this metric's windowed means per trial, e.g. actor/entropy")
    parser.add_argument("--window", type=int, default=10, help="logged steps per --curve window (default 10)")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window {args.window}: must be at least 1 logged step, e.g. --window 10")
    uri = args.tracking_uri or default_tracking_uri()
    finished = []
    for name in args.experiments:
        try:
            sweep = open_sweep(name, uri)
        except (UnknownExperiment, BadArchive, ValueError) as e:
            print(e, file=sys.stderr)
            return 2
        print(f"### {sweep.experiment}\n")
        print("\n".join(trial_rows(sweep)) + "\n")
        if args.curve:
            print("\n".join(curve_rows(sweep, args.curve, args.window)) + "\n")
        finished += [t for t in sweep.trials if t.status == "FINISHED"]
    if args.alarms:
        print(f"### Monitors over {len(finished)} finished trials\n")
        print("\n".join(alarm_rows(finished)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
