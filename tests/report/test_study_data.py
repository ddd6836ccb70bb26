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


def test_the_same_settings_and_seeds_ran_twice_give_the_same_curves():
    """shaped_annealing's constant-0.9 arm is shaped_vs_filter's paper arm, seeds 0-4, run hours
    apart in other processes (two of the five stopped at step 59 and resumed from a checkpoint):
    every logged curve but wall-clock time must match value for value (docs/reproduction.md, Q5
    annealing)."""
    data = ROOT / "docs" / "data" / "mechanism"
    again = [t for t in load(data / "shaped_annealing.json.gz").trials if t.arm == "const09"]
    first = {t.seed: t for t in load(data / "shaped_vs_filter.json.gz").trials if t.arm == "paper"}
    assert sorted(t.seed for t in again) == ["0", "1", "2", "3", "4"]
    for t in again:
        shared = set(t.history) & set(first[t.seed].history)
        compared = [m for m in shared if not m.startswith(("time/", "cost/cum_wall"))]
        assert "eval/success" in compared and "rollout/template_frac" in compared and len(compared) >= 20
        assert [m for m in compared if t.curve(m) != first[t.seed].curve(m)] == [], f"seed {t.seed}"
