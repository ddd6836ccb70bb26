"""One training run's curves from its metrics.jsonl (the same as `python -m ragen2_core.report.run_curves`).

    python reports/run_curves.py runs/smollm2_frozenlake --out docs/figures/smollm2/grpo_run.png [--metrics a,b]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from ragen2_core.report.run_curves import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
