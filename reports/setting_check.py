"""Is the reasoning needed in a setting? The acceptance numbers of a base config's warm start.
The logic is ragen2_core/report/setting_check.py; this file runs it (= ragen2 setting-check).

    python reports/setting_check.py --help
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.report.setting_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
