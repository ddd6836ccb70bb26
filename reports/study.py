"""Tables (and figures) of a multi-sweep study from MLflow or sweep archives.
The logic is ragen2_core/report/study.py; this file runs it (= ragen2 study).

    python reports/study.py --help
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report.study import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
