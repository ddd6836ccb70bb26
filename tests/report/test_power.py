"""The power plan (ragen2 power) from pilot finals, with the numbers derived by hand."""
from pathlib import Path

import pytest

from ragen2_core.report import power


def test_plan_row_on_the_pilots_own_validation_set_uses_its_spread():
    # finals 0.5, 0.6, 0.7, 0.6 on the same 300 fixed seeds: mean 0.6, SD sqrt(0.02 / 3) = 0.081650,
    # which is the planned trial SD. 10 seeds per arm, t on 18 df: (2.10092 + 0.86204) * 0.081650
    # * sqrt(0.2) = 0.108193. Upper bound: 0.081650 * sqrt(3 / chi2_.20(3)) = 0.081650 * sqrt(3 / 1.00517)
    # = 0.141057.
    r = power.plan_row([0.5, 0.6, 0.7, 0.6], 300, episodes=300, seeds=10, mde=0.05, alpha=0.05, power=0.8)
    assert (r["n"], r["mean"], r["approximate"]) == (4, pytest.approx(0.6), False)
    assert r["sd"] == r["trial_sd"] == pytest.approx(0.081650, abs=1e-6)
    assert r["mde"] == pytest.approx(0.108193, abs=1e-5)
    assert r["trial_sd_upper"] == pytest.approx(0.141057, abs=1e-5)
    assert r["seeds_needed"] > 10 and r["seeds_needed_upper"] > r["seeds_needed"]


def test_plan_row_at_another_validation_size_splits_off_binomial_noise():
    # The same finals from a pilot that validated on 100 episodes, planned at 300: binomial variance
    # 0.24 / 100 = 0.0024 comes off, 0.24 / 300 = 0.0008 goes on: sqrt(0.0066667 - 0.0024 + 0.0008)
    # = 0.071181. Upper: sqrt(0.141057^2 - 0.0024 + 0.0008) = sqrt(0.019897 - 0.0016) = 0.135267.
    r = power.plan_row([0.5, 0.6, 0.7, 0.6], 100, episodes=300, seeds=10, mde=0.05, alpha=0.05, power=0.8)
    assert r["approximate"]
    assert r["trial_sd"] == pytest.approx(0.071181, abs=1e-6)
    assert r["trial_sd_upper"] == pytest.approx(0.135267, abs=1e-5)


def test_plan_row_edges():
    # Every seed equal and every episode won: nothing varies, two seeds suffice.
    r = power.plan_row([1.0, 1.0, 1.0], 300, episodes=300, seeds=10, mde=0.05, alpha=0.05, power=0.8)
    assert r["trial_sd"] == 0.0 and r["mde"] == 0.0 and r["seeds_needed"] == 2
    # One pilot seed: no SD, no plan (never a made-up number).
    one = power.plan_row([0.6], 100, episodes=300, seeds=10, mde=0.05, alpha=0.05, power=0.8)
    assert one["sd"] is None and one["mde"] is None and one["seeds_needed"] is None


def test_bad_arguments_exit_2_before_reading_anything(capsys, tmp_path):
    uri = f"sqlite:///{tmp_path / 'none.db'}"
    assert power.main(["x", "--tracking-uri", uri, "--seeds", "1", "--mde", "2"]) == 2
    err = capsys.readouterr().err
    assert "--seeds 1: must be >= 2" in err and "--mde 2.0: must be in (0, 1)" in err
    assert not (tmp_path / "none.db").exists()


def test_a_step_never_validated_is_named_with_the_steps_that_were(capsys):
    p1 = Path(__file__).resolve().parents[2] / "docs" / "data" / "mechanism" / "p1_shaped.json.gz"
    assert power.main([str(p1), "--at-step", "50"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--at-step 50: no trial of p1_shaped was validated then; it validated at steps 20, 40, 60, 80" in captured.err
    assert power.main([str(p1), "--at-step", "40"]) == 0 and "| nofilter | all | 2 | 300 |" in capsys.readouterr().out
