"""Write a sweep archive back into an MLflow store as the instance it was (its finished trials), so
`sweeps/run.py SPEC --resume` goes on with the rest: a sweep moved to a fresh machine or another
store (ragen2_core/report/restore.py says what is and is not restored).

    python reports/restore.py docs/data/mechanism/in_progress/shaped_noise.json.gz [--tracking-uri URI]

Exit status: 0 restored; 2 not a sweep archive, or the store holds that instance already (nothing written).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report.archive import BadArchive, load  # noqa: E402
from ragen2_core.report.collect import UnknownExperiment  # noqa: E402
from ragen2_core.report.restore import AlreadyThere, restore  # noqa: E402
from ragen2_core.tracking.mlflow_sink import default_tracking_uri  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", help="a <sweep>.json.gz written by reports/archive.py")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    args = parser.parse_args(argv)
    uri = args.tracking_uri or default_tracking_uri()
    try:
        sweep = load(args.archive)
        done = restore(sweep, uri, source=Path(args.archive).name)
    except (UnknownExperiment, BadArchive, AlreadyThere, ValueError) as e:
        print(f"restore: {e}", file=sys.stderr)
        return 2
    print(f"restore: sweep '{sweep.experiment}' instance {done.instance} into {uri} (run {done.parent_run_id}): "
          f"{done.finished} finished trials of {len(sweep.expected) or len(sweep.trials)} planned; "
          f"{len(done.left_out)} unfinished left out. Continue: python sweeps/run.py SPEC --resume {done.instance}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
