"""The study's committed sweep archives (docs/data/*/): each reads back, and holds every planned
trial finished with its primary endpoint, so docs/reproduction.md's tables rebuild from them."""
from pathlib import Path

import pytest

from ragen2_core.report.archive import load

ROOT = Path(__file__).resolve().parents[2]
ARCHIVES = sorted((ROOT / "docs" / "data").glob("*/*.json.gz"))


def test_the_study_has_archives():
    assert ARCHIVES, "docs/data/ holds no sweep archive; docs/reproduction.md's answers are built from them"


@pytest.mark.parametrize("path", ARCHIVES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_archive_is_complete(path):
    sweep = load(path)
    assert path.name == f"{sweep.experiment}.json.gz"
    planned = {e["trial_id"] for e in sweep.expected}
    finished = {t.trial_id for t in sweep.trials if t.status == "FINISHED"}
    assert planned and planned == finished, f"unfinished or unplanned trials: {planned ^ finished}"
    # Trials that ran their course end their validation at one step; an early-stopped trial (a stop
    # rule fired: its stop_reason says which) ends before it.
    ended = {t.trial_id: t.curve("eval/success")[0][-1] for t in sweep.trials}
    full = {ended[t.trial_id] for t in sweep.trials if t.stop_reason == "completed"}
    assert len(full) == 1, f"completed trials end their validation at different steps: {full}"
    early = [t for t in sweep.trials if t.stop_reason != "completed"]
    assert all(t.stop_reason and ended[t.trial_id] <= min(full) for t in early), \
        [(t.trial_id, t.stop_reason, ended[t.trial_id]) for t in early]
    seeds = sweep.spec["seeds"]
    n_seeds = seeds if isinstance(seeds, int) else len(seeds)
    assert len(sweep.trials) == len(sweep.arms) * len(sweep.conditions) * n_seeds
