"""Report statistics on tiny samples whose expected values are derived in the comments."""
import math

import numpy as np
import pytest

from ragen2_core.report import power, stats


def test_iqm_by_hand():
    # sorted: 0 1 2 3 4 5 6 100; 25 % of 8 = 2 cut from each end -> mean(2, 3, 4, 5) = 3.5
    assert stats.iqm([0, 1, 2, 3, 4, 100, 5, 6]) == pytest.approx(3.5)
    assert stats.iqm([]) is None


def test_all_equal_seeds_give_a_zero_width_interval_not_nan():
    # BCa divides by the jackknife spread, 0 here: scipy returns NaN. The report states the fallback.
    est = stats.mean_ci([0.25, 0.25, 0.25])
    assert (est.value, est.low, est.high, est.n) == (0.25, 0.25, 0.25, 3)
    assert "all equal" in est.method
    assert stats.fmt_ci(est) == "0.250 [0.250, 0.250]"
    assert "nan" not in stats.fmt_ci(stats.mean_ci([float("nan"), 0.5])).lower()


def test_edges_never_print_nan():
    assert stats.fmt_ci(stats.mean_ci([])) == stats.DASH          # no data
    one = stats.mean_ci([0.4])                                    # one seed: a value, no interval
    assert (one.value, one.low, one.high) == (0.4, None, None) and stats.fmt_ci(one) == "0.400"
    assert stats.fmt(float("nan")) == stats.DASH and stats.fmt(None) == stats.DASH
    assert stats.fmt_p(None) == stats.DASH
    # a difference of equal means can come out as -1e-17 in floating point: printed as zero, not "-0.0"
    assert stats.fmt(-1e-17, 1) == "0.0" and stats.fmt(-0.04, 1) == "0.0"
    assert stats.fmt(-0.06, 1) == "-0.1"


def test_bca_is_used_from_ten_seeds_and_falls_back_when_undefined():
    assert stats.mean_ci(np.arange(10.0)).method == "BCa bootstrap"
    assert stats.mean_ci([0.2, 0.3, 0.4]).method == "percentile bootstrap"   # few seeds: see stats.choose
    # Degenerate for BCa but not all equal: 9 equal values and one outlier still gets an interval.
    est = stats.mean_ci([1.0] * 9 + [2.0], method="BCa")
    assert est.low is not None and est.low <= est.value <= est.high


def test_bootstrap_interval_coverage_sanity():
    # 60 normal samples of n=20 with true mean 0: a 95 % interval should cover 0 most of the time.
    # Binomial(60, 0.95) falls below 50 with probability < 0.1 %; bootstrap intervals undercover a
    # little at n=20, so the bound is loose on purpose: this catches a broken interval, not a 1 % bias.
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(60):
        est = stats.mean_ci(rng.normal(0, 1, 20), n_resamples=500)
        covered += est.low <= 0 <= est.high
    assert covered >= 50


def test_t_interval_by_hand():
    # mean 0.3, sd 0.1, se 0.1/sqrt(3); t(0.975, 2) = 4.3027 -> 0.3 +- 0.24842
    est = stats.t_ci([0.2, 0.3, 0.4])
    assert est.low == pytest.approx(0.3 - 0.24842, abs=1e-4) and est.high == pytest.approx(0.3 + 0.24842, abs=1e-4)


def test_permutation_p_exact_tiny_case():
    # x = 1 2 3, y = 4 5 6: C(6, 3) = 20 equally likely splits; only the observed one and its mirror
    # image reach |mean difference| = 3, so the two-sided p = 2 / 20 = 0.1.
    assert stats.permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    assert stats.smallest_p(3, 3) == pytest.approx(0.1)
    assert stats.permutation_p([1, 1], [1, 1]) == 1.0


def test_permutation_p_with_a_sample_of_one():
    # x = 3, y = 0 1 2: the 4 splits put one of 3, 0, 1, 2 alone; its mean minus the other three's:
    # 3 - 1 = 2 (observed), 0 - 2 = -2, 1 - 5/3 = -2/3, 2 - 4/3 = 2/3. P(null >= 2) = 1/4,
    # P(null <= 2) = 1, so the two-sided p = 2 * 1/4 = 0.5, either way round.
    assert stats.permutation_p([3], [0, 1, 2]) == pytest.approx(0.5)
    assert stats.permutation_p([0, 1, 2], [3]) == pytest.approx(0.5)
    # one against one: 2 splits, the observed and its mirror, p = 2 * 1/2 = 1
    assert stats.permutation_p([0.6], [0.7]) == pytest.approx(1.0)
    # the same as scipy gives where it accepts the samples: 2 against 3
    assert stats.permutation_p([3, 4], [0, 1, 2]) == pytest.approx(stats._exact_permutation_p(
        np.array([3.0, 4.0]), np.array([0.0, 1.0, 2.0])))


def test_spearman_by_hand():
    # ranks x = 1 2 3 4, y = 1 3 2 4: d = 0 -1 1 0, sum d^2 = 2; rho = 1 - 6*2 / (4 * 15) = 0.8
    r = stats.spearman_ci([1, 2, 3, 4], [1, 3, 2, 4])
    assert r["rho"] == pytest.approx(0.8)
    assert r["low"] <= 0.8 <= r["high"] and r["n"] == 4
    assert stats.spearman_ci([1, 2], [1, 2])["rho"] is None          # too few trials: said, not NaN
    assert stats.spearman_ci([1, 1, 1], [1, 2, 3])["rho"] is None     # constant predictor


def test_holm_by_hand():
    # p = .01 .04 .03, m = 3; sorted .01*3 = .03, .03*2 = .06, .04*1 = .04 -> running max .03 .06 .06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, None]) == [0.5, None]


def test_bh_matches_hand_values():
    # BH: sorted .01 .03 .04 -> .01*3/1 = .03, .03*3/2 = .045, .04*3/3 = .04; step-up min from the top:
    # .03, .04, .04 -> in input order [.03, .04, .04]
    assert stats.bh([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.04, 0.04])


def test_probability_of_improvement_by_hand():
    # x = 1 2 3 vs y = 2 2 0: wins + half ties over 9 pairs: x=1 beats 0 (1); x=2 ties 2,2 (0.5+0.5)
    # and beats 0 (1); x=3 beats all (3) -> 6 / 9
    est = stats.probability_of_improvement([[1, 2, 3]], [[2, 2, 0]])
    assert est.value == pytest.approx(6 / 9)
    assert 0 <= est.low <= est.value <= est.high <= 1
    # two conditions: the mean of the per-condition probabilities, (1 + 0) / 2
    assert stats.probability_of_improvement([[5, 6], [0, 0]], [[1, 2], [3, 4]]).value == pytest.approx(0.5)


def test_stratified_iqm_and_profile():
    est = stats.stratified_iqm_ci([[0.1, 0.2, 0.3], [0.5, 0.6, 0.9]])
    # all six: 0.1 0.2 0.3 0.5 0.6 0.9; int(0.25 * 6) = 1 cut per end -> mean(0.2, 0.3, 0.5, 0.6) = 0.4
    assert est.value == pytest.approx(0.4) and est.low <= 0.4 <= est.high
    prof = stats.performance_profile([0.2, 0.4, 0.6, 0.8], [0.0, 0.5, 0.8])
    # > 0.0: all 4; > 0.5: 0.6 and 0.8; > 0.8: none
    assert list(prof["frac"]) == [1.0, 0.5, 0.0]


def test_diff_interval():
    d = stats.diff_ci([0.5, 0.6, 0.7], [0.2, 0.3, 0.4])
    assert d.value == pytest.approx(0.3) and d.low <= 0.3 <= d.high
    assert stats.diff_ci([0.5], []).value is None
    assert math.isclose(stats.diff_ci([0.5, 0.5], [0.2, 0.2]).low, 0.3)


def test_interaction_is_a_difference_of_differences():
    # (mean 0.5 0.6 0.7 - mean 0.2 0.3 0.4) - (mean 0.3 0.4 0.5 - mean 0.25 0.35 0.45)
    # = (0.6 - 0.3) - (0.4 - 0.35) = 0.25
    a, b, c, d = [0.5, 0.6, 0.7], [0.2, 0.3, 0.4], [0.3, 0.4, 0.5], [0.25, 0.35, 0.45]
    est = stats.interaction_ci(a, b, c, d)
    assert est.value == pytest.approx(0.25) and est.low < 0.25 < est.high and est.n == 12
    # an effect that is the same under both conditions: zero, with an interval around it
    same = stats.interaction_ci(a, b, a, b)
    assert same.value == pytest.approx(0.0) and same.low < 0 < same.high
    # edges: an empty cell gives no value; a cell of one trial a value without interval; no spread
    # in any cell a zero-width interval at (0.6 - 0.2) - (0.5 - 0.5) = 0.4
    assert stats.interaction_ci(a, b, c, []).value is None
    one = stats.interaction_ci(a, b, c, [0.35])
    assert one.value == pytest.approx(0.25) and one.low is None
    flat = stats.interaction_ci([0.6, 0.6], [0.2, 0.2], [0.5, 0.5], [0.5, 0.5])
    assert (flat.low, flat.high) == pytest.approx((0.4, 0.4))
    # the plain difference keeps its behaviour through the shared code
    assert stats.diff_ci([0.5], []).method == "no data in an arm"


def test_mde_of_an_interaction_is_sqrt2_times_a_difference():
    # four cells of n: SE sd * sqrt(4 / n) against sd * sqrt(2 / n) for two arms
    plain = stats.min_detectable_difference(0.1, 10)
    assert stats.min_detectable_difference(0.1, 10, cells=4) == pytest.approx(plain * 2 ** 0.5)
    # t-corrected: (t_.975 + t_.8) on 4 * (10 - 1) = 36 df: 2.0281 + 0.8518 = 2.8799;
    # x 0.1 x sqrt(4 / 10) = 0.18214
    assert stats.min_detectable_difference(0.1, 10, t=True, cells=4) == pytest.approx(0.18214, abs=1e-4)


def test_wilson_interval_matches_hand_values_and_stays_inside_zero_one():
    # 8 of 10, z = 1.96: centre (0.8 + 1.9208/10) / 1.38416 = 0.72246, half-width
    # 1.96 * sqrt(0.016 + 0.0096040) / 1.38416 = 0.22658 -> [0.4902, 0.9433].
    est = stats.wilson_ci(8, 10)
    assert (est.value, round(est.low, 4), round(est.high, 4)) == (0.8, 0.4902, 0.9433)
    zero, full = stats.wilson_ci(0, 20), stats.wilson_ci(20, 20)
    assert zero.low == 0.0 and zero.high > 0.1 and full.high == 1.0 and full.low < 0.9
    assert stats.wilson_ci(0, 0).value is None


def test_proportion_difference_is_newcombes_method_10():
    # Newcombe (1998), Stat. Med. 17:873, example (a): 56/70 vs 48/80 -> 0.2000 [0.0524, 0.3339].
    est = stats.proportion_diff_ci(56, 70, 48, 80)
    assert round(est.value, 4) == 0.2 and (round(est.low, 4), round(est.high, 4)) == (0.0524, 0.3339)
    assert stats.proportion_diff_ci(3, 0, 1, 5).value is None


def test_minimum_detectable_difference_and_trial_sd():
    # (1.95996 + 0.84162) * 0.1 * sqrt(2 / 10) = 0.12529
    assert stats.min_detectable_difference(0.1, 10) == pytest.approx(0.12529, abs=1e-5)
    # Four times the trials halve it.
    assert stats.min_detectable_difference(0.1, 40) == pytest.approx(0.12529 / 2, abs=1e-5)
    # sqrt(0.05^2 + 0.25 / 300) = sqrt(0.0025 + 0.000833) = 0.057735
    assert power.trial_sd(0.05, 0.5, 300) == pytest.approx(0.057735, abs=1e-6)
    assert power.trial_sd(0.0, 1.0, 300) == 0.0
    # seed_sd undoes trial_sd; binomial noise larger than the spread leaves no seed part.
    assert power.seed_sd(0.057735, 0.5, 300) == pytest.approx(0.05, abs=1e-5)
    assert power.seed_sd(0.01, 0.5, 300) == 0.0


def test_small_sample_mde_seeds_needed_and_sd_upper_bound():
    # t quantiles on 2 * 10 - 2 = 18 df: t_.975 = 2.10092, t_.80 = 0.86204; (2.10092 + 0.86204) * 0.1
    # * sqrt(0.2) = 0.13251, above the normal 0.12529.
    assert stats.min_detectable_difference(0.1, 10, t=True) == pytest.approx(0.13251, abs=1e-5)
    assert stats.min_detectable_difference(0.1, 1, t=True) == float("inf")
    # sd 0.1, target 0.1: n = 17 gives (2.0369 + 0.8530) * 0.1 * sqrt(2/17) = 0.09912, n = 16 gives
    # (2.0423 + 0.8538) * 0.1 * sqrt(2/16) = 0.10239.
    assert power.seeds_needed(0.1, 0.1) == 17
    assert stats.min_detectable_difference(0.1, 17, t=True) <= 0.1 < stats.min_detectable_difference(0.1, 16, t=True)
    # 80 % upper bound from 5 values: sqrt(4 / chi2_.20(4)) = sqrt(4 / 1.64878) = 1.55756
    assert power.sd_upper(1.0, 5) == pytest.approx(1.55756, abs=1e-4)
    assert power.sd_upper(1.0, 1) == float("inf")
