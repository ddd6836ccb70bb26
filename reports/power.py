"""Power plan of a study from its no-filter pilots: seeds and validation episodes per arm.
The logic is ragen2_core/report/power.py; this file runs it (= ragen2 power).

    python reports/power.py --help
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report.power import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
