"""Save sweeps from the MLflow store as archive files, so their reports and study tables can be
rebuilt without the store (docs/reproduction.md keeps the doors study's archives in docs/data/doors).

    python reports/archive.py filter_vs_nofilter [kl_vs_filter ...] --out docs/data/doors \
        [--tracking-uri URI] [--instance ID]

Writes <out>/<experiment>.json.gz per sweep (its latest instance, or --instance with one sweep),
then reads each file back and checks it holds the same trials, curves and samples as the store.
Rebuild from one: `ragen2 report --archive FILE`, `python reports/study.py FILE ...`,
`python reports/power.py FILE`. Exit status: 0 written; 1 a file did not read back the same; 2 unknown experiment or instance.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report.archive import SUFFIX, load, same_content, save  # noqa: E402
from ragen2_core.report.collect import UnknownExperiment, collect, eval_samples  # noqa: E402
from ragen2_core.tracking.mlflow_sink import default_tracking_uri  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="sweep names (MLflow experiments)")
    parser.add_argument("--out", required=True, help="folder for the <experiment>.json.gz files")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--instance", help="sweep instance to save (one experiment only; default: the latest)")
    args = parser.parse_args(argv)
    if args.instance and len(args.experiments) > 1:
        print(f"--instance {args.instance!r} names one instance; pass one experiment with it "
              f"(got {len(args.experiments)})", file=sys.stderr)
        return 2
    uri = args.tracking_uri or default_tracking_uri()
    for name in args.experiments:
        try:
            sweep = collect(uri, name, instance=args.instance)
        except UnknownExperiment as e:
            print(e, file=sys.stderr)
            return 2
        sweep.samples = {t.run_id: eval_samples(sweep, t) for t in sweep.trials}
        path = save(sweep, Path(args.out) / f"{name}{SUFFIX}")
        back = load(path)
        if not same_content(back, sweep):
            print(f"archive: {path} does not read back as the sweep it was written from; not trusted "
                  "(report this with the file)", file=sys.stderr)
            return 1
        n_samples = sum(len(v) for v in sweep.samples.values())
        print(f"archive: {path} ({path.stat().st_size // 1024} KiB): {len(sweep.trials)} trials of "
              f"{len(sweep.expected)} planned, {n_samples} validation sample files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
