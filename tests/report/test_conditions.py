"""A planned condition and the trials that ran it are one cell, whatever order their keys are
spelled in (older sweeps' trials.csv sorted them; group names keep the spec's order)."""
from pathlib import Path

from ragen2_core.report.archive import load
from ragen2_core.report.collect import Sweep, Trial

ROOT = Path(__file__).resolve().parents[2]


def test_planned_conditions_take_the_trials_spelling():
    ran = Trial(run_id="r", trial_id="t0", arm="nofilter", condition="algo.kl_coef=0.3 algo.entropy_coef=0.001",
                seed="0", status="FINISHED", stop_reason="completed", params={}, tags={}, start_ms=None, end_ms=None,
                history={})
    expected = [{"trial_id": "t0", "arm": "nofilter", "seed": "0", "condition": "algo.entropy_coef=0.001 algo.kl_coef=0.3"},
                {"trial_id": "t1", "arm": "nofilter", "seed": "1", "condition": "algo.entropy_coef=0.001 algo.kl_coef=0.3"},
                {"trial_id": "t2", "arm": "nofilter", "seed": "0", "condition": "algo.entropy_coef=0.3 algo.kl_coef=0"}]
    sweep = Sweep(tracking_uri="", experiment="x", experiment_id="0", parent=None, spec_text="", spec={},
                  trials=[ran], expected=expected, axes=[])
    # the started condition is one cell of 2 planned; the unstarted one keeps the csv spelling
    assert sweep.conditions == ["algo.kl_coef=0.3 algo.entropy_coef=0.001", "algo.entropy_coef=0.3 algo.kl_coef=0"]
    assert sweep.planned("nofilter", "algo.kl_coef=0.3 algo.entropy_coef=0.001") == 2


def test_shaped_regularisers_archive_has_two_conditions_of_ten_trials():
    sweep = load(ROOT / "docs" / "data" / "mechanism" / "shaped_regularisers.json.gz")
    assert len(sweep.conditions) == 2
    assert [len(sweep.cell(a, c)) for a in sweep.arms for c in sweep.conditions] == [5, 5, 5, 5]
