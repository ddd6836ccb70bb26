"""Build the comparative PDF report of a sweep (the same as `ragen2 report`).

    python reports/build.py --experiment kl_vs_filter [--tracking-uri URI] [--out reports/out/kl_vs_filter.pdf]
                            [--baseline nofilter] [--include-running]

The default tracking URI is the trainer's: $MLFLOW_TRACKING_URI, else sqlite ./mlflow.db.
Writes the PDF and, beside it, the tables as CSV and a JSON summary. See docs/reports.md.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from ragen2_core.report.build import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
