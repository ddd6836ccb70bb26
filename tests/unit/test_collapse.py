"""Tests for the template-collapse MI proxy (ragen2_core.metrics.collapse)."""
import math
import re

import pytest
import torch

from ragen2_core.metrics.collapse import (
    collapse_metrics, ema_state, ema_update, mi_from_scores, mi_zscore, permutation_null, release_zscores,
)


def independent_scores(n=6, k=3, seed=0):
    """Every reasoning is equally likely under every prompt: scores[i, k, j] constant in j."""
    g = torch.Generator().manual_seed(seed)
    per_sample = -torch.rand(n, k, 1, generator=g) * 20
    return per_sample.expand(n, k, n).clone()


def one_to_one_scores(n=8, k=4):
    """Each reasoning is only possible under its own prompt."""
    s = torch.full((n, k, n), -1e4)
    idx = torch.arange(n)
    s[idx, :, idx] = 0.0
    return s


# ---------------------------------------------------------------- mi_from_scores

def test_independent_samples_have_zero_mi_and_chance_retrieval():
    s = independent_scores(n=6)
    m = mi_from_scores(s)
    # marginal = logsumexp of 6 equal values - log 6 = the value itself = matched.
    assert m["mi"] == pytest.approx(0.0, abs=1e-12)
    # All 6 prompts tie; the default split rule gives 1/6 credit each, i.e. exactly chance.
    assert m["retrieval_acc"] == pytest.approx(1 / 6)
    assert m["retrieval_chance"] == pytest.approx(1 / 6)
    assert m["cond_entropy"] == pytest.approx(m["marginal_entropy"])
    assert mi_from_scores(s, ties="strict")["retrieval_acc"] == 0.0
    # First-index argmax: only the reasonings of prompt 0 are "retrieved".
    assert mi_from_scores(s, ties="first")["retrieval_acc"] == pytest.approx(1 / 6)


def test_one_to_one_mapping_reaches_log_n():
    n = 8
    m = mi_from_scores(one_to_one_scores(n=n))
    # matched = 0, marginal = log(1 + 7 e^-1e4) - log 8 = -log 8, so mi = log 8.
    assert m["mi"] == pytest.approx(math.log(n), abs=1e-4)
    assert m["mi_upper_bound"] == pytest.approx(math.log(n))
    assert m["retrieval_acc"] == 1.0
    assert m["cond_entropy"] == pytest.approx(0.0)
    assert m["marginal_entropy"] == pytest.approx(math.log(n), abs=1e-4)


def test_hand_worked_2x1x2():
    s = torch.tensor([[[-1.0, -2.0]], [[-3.0, -1.0]]])
    # i=0: matched -1; lse(-1, -2) = -1 + log(1 + e^-1) = -0.68673831
    #      marginal = -0.68673831 - log 2 = -1.37988549; matched - marginal = 0.37988549
    # i=1: matched -1; lse(-3, -1) = -1 + log(1 + e^-2) = -0.87307199
    #      marginal = -0.87307199 - log 2 = -1.56621917; matched - marginal = 0.56621917
    # mi = (0.37988549 + 0.56621917) / 2 = 0.47305233
    # cond_entropy = -(-1 - 1) / 2 = 1; marginal_entropy = (1.37988549 + 1.56621917) / 2 = 1.47305233
    m = mi_from_scores(s)
    assert m["mi"] == pytest.approx(0.47305233, abs=1e-6)
    assert m["cond_entropy"] == pytest.approx(1.0, abs=1e-6)
    assert m["marginal_entropy"] == pytest.approx(1.47305233, abs=1e-6)
    assert m["mi_upper_bound"] == pytest.approx(math.log(2))
    assert m["retrieval_acc"] == 1.0          # both argmaxes on the diagonal
    assert m["retrieval_chance"] == 0.5


def test_per_token_divides_by_clamped_lengths():
    s = torch.tensor([[[-1.0, -2.0]], [[-3.0, -1.0]]])
    lengths = torch.tensor([[2], [0]])
    # Row 0 / 2 -> [-0.5, -1]; row 1 / max(0, 1) -> [-3, -1] (unchanged).
    # i=0: lse(-0.5, -1) = -0.5 + log(1 + e^-0.5) = -0.02592302
    #      marginal = -0.02592302 - log 2 = -0.71907020; matched - marginal = 0.21907020
    # i=1: as in the per-sequence example, 0.56621917
    # mi = (0.21907020 + 0.56621917) / 2 = 0.39264468
    # cond_entropy = (0.5 + 1) / 2 = 0.75; marginal_entropy = (0.71907020 + 1.56621917) / 2 = 1.14264468
    m = mi_from_scores(s, lengths=lengths, per_token=True)
    assert m["mi"] == pytest.approx(0.39264468, abs=1e-6)
    assert m["cond_entropy"] == pytest.approx(0.75, abs=1e-6)
    assert m["marginal_entropy"] == pytest.approx(1.14264468, abs=1e-6)
    # Lengths are ignored unless per_token is set.
    assert mi_from_scores(s, lengths=lengths)["mi"] == pytest.approx(0.47305233, abs=1e-6)


def test_per_token_needs_matching_lengths():
    s = torch.zeros(2, 1, 2)
    with pytest.raises(ValueError, match="lengths"):
        mi_from_scores(s, per_token=True)
    with pytest.raises(ValueError, match=r"\(2, 1\)"):
        mi_from_scores(s, lengths=torch.ones(2, 3), per_token=True)


@pytest.mark.parametrize("shape", [(4, 4), (3, 2, 4), (2, 2, 2, 2)])
def test_bad_shape_names_the_shape(shape):
    with pytest.raises(ValueError, match=r"\[N, K, N\].*" + re.escape(str(shape))):
        mi_from_scores(torch.zeros(shape))


def test_single_prompt_rejected():
    with pytest.raises(ValueError, match=r"N >= 2.*\(1, 3, 1\)"):
        mi_from_scores(torch.zeros(1, 3, 1))


def test_non_finite_and_bad_ties_rejected():
    s = torch.zeros(2, 1, 2)
    s[0, 0, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        mi_from_scores(s)
    with pytest.raises(ValueError, match="ties"):
        mi_from_scores(torch.zeros(2, 1, 2), ties="random")


@pytest.mark.parametrize("seed", range(8))
def test_mi_bounded_by_log_n_on_random_scores(seed):
    g = torch.Generator().manual_seed(seed)
    n, k = 2 + seed, 1 + seed % 3
    s = torch.randn(n, k, n, generator=g) * 10 ** (seed % 4)
    lengths = torch.randint(0, 30, (n, k), generator=g)
    for per_token in (False, True):
        m = mi_from_scores(s, lengths=lengths, per_token=per_token)
        # logsumexp_j >= matched, so matched - marginal <= log N for every (i, k).
        assert m["mi"] <= math.log(n) + 1e-9
        assert 0.0 <= m["retrieval_acc"] <= 1.0
        assert m["mi"] == pytest.approx(m["marginal_entropy"] - m["cond_entropy"], abs=1e-9)


# ---------------------------------------------------------------- permutation null

def test_null_for_one_to_one_is_far_below_mi():
    s = one_to_one_scores(n=8, k=4)
    null = permutation_null(s, n_perm=64, seed=0)
    assert null.shape == (64,)
    # A random relabelling keeps ~1 of 8 prompts in place, so the null MI sits near -1e4 * 7/8.
    assert null.mean().item() < -1000
    z = mi_zscore(s, n_perm=64, seed=0)
    assert z["mi"] == pytest.approx(math.log(8), abs=1e-4)
    assert z["null_mean"] == pytest.approx(null.mean().item())
    assert z["zscore"] > 3


def test_null_for_independent_samples_gives_zero_zscore():
    z = mi_zscore(independent_scores(n=6), n_perm=16, seed=1)
    # Every relabelling picks out identical scores: the null is a point mass at mi.
    assert z["null_std"] == 0.0
    assert z["zscore"] == 0.0
    assert z["null_mean"] == pytest.approx(z["mi"])


def test_prompt_offsets_alone_give_zero_zscore():
    # scores = a[i,k] + b[j]: some prompts make everything likelier, but z ignores the prompt.
    # A permutation only reorders b, so sum_i b[pi(i)] = sum_i b[i] and every null value equals mi.
    # float64 so that rounding of a + b stays far below the std floor.
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 2, 1, generator=g, dtype=torch.float64)
    s = a + torch.randn(1, 1, 5, generator=g, dtype=torch.float64) * 5
    z = mi_zscore(s, n_perm=16, seed=0)
    assert abs(z["zscore"]) < 1e-6


def test_iid_noise_scores_have_small_zscores():
    zs = []
    for seed in range(20):
        g = torch.Generator().manual_seed(100 + seed)
        zs.append(mi_zscore(torch.randn(8, 4, 8, generator=g), n_perm=64, seed=seed)["zscore"])
    # Under the null z is roughly standard normal.
    assert max(abs(z) for z in zs) < 4
    assert abs(sum(zs) / len(zs)) < 1


def test_null_is_seeded_and_sized():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(6, 3, 6, generator=g)
    a = permutation_null(s, n_perm=10, seed=7)
    b = permutation_null(s, n_perm=10, seed=7)
    c = permutation_null(s, n_perm=10, seed=8)
    assert a.shape == (10,)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert permutation_null(s, n_perm=3, seed=7).shape == (3,)
    assert mi_zscore(s, n_perm=10, seed=7) == mi_zscore(s, n_perm=10, seed=7)


def test_null_per_token_uses_lengths():
    s = torch.tensor([[[-1.0, -2.0]], [[-3.0, -1.0]]])
    lengths = torch.tensor([[2], [0]])
    null = permutation_null(s, n_perm=20, seed=0, lengths=lengths, per_token=True)
    # With N = 2 the only draws are the identity (mi = 0.39264468) and the swap:
    # matched = [-1, -3], marginals as in the per-token example, so
    # mi_swap = ((-1 + 0.71907020) + (-3 + 1.56621917)) / 2 = -0.85735532
    values = sorted({round(v, 6) for v in null.tolist()})
    assert values == [pytest.approx(-0.85735532, abs=1e-6), pytest.approx(0.39264468, abs=1e-6)]


def test_bad_n_perm_rejected():
    s = torch.randn(3, 2, 3)
    with pytest.raises(ValueError, match="n_perm"):
        permutation_null(s, n_perm=0, seed=0)
    with pytest.raises(ValueError, match="n_perm"):
        mi_zscore(s, n_perm=1, seed=0)


def test_degenerate_null_stays_finite():
    # N = 2 has two permutations; with n_perm = 2 some seeds draw the same one twice (null_std 0).
    s = one_to_one_scores(n=2, k=1)
    both_identity = mi_zscore(s, n_perm=2, seed=3)       # null = [mi, mi]
    assert both_identity["null_std"] == 0.0 and both_identity["zscore"] == 0.0
    both_swap = mi_zscore(s, n_perm=2, seed=1)           # null = [mi_swap, mi_swap] far below mi
    assert both_swap["null_std"] == 0.0
    # (log 2 - (-1e4 - (-log 2))) / 1e-8: large, positive, finite.
    assert both_swap["zscore"] == pytest.approx(1e4 / 1e-8, rel=1e-6)
    assert math.isfinite(both_swap["zscore"])


# ---------------------------------------------------------------- ema and logging dict

def test_ema_by_hand():
    ema = None
    seen = []
    for v in [1.0, 0.0, 2.0, float("nan"), 1.0]:
        ema = ema_update(ema, v, decay=0.9)
        seen.append(ema)
    # 1.0 -> 0.9*1 + 0.1*0 = 0.9 -> 0.9*0.9 + 0.1*2 = 1.01 -> NaN skipped: 1.01
    # -> 0.9*1.01 + 0.1*1 = 1.009
    assert seen == pytest.approx([1.0, 0.9, 1.01, 1.01, 1.009])


def test_ema_edge_cases():
    assert ema_update(None, 3.0) == 3.0
    assert ema_update(None, float("nan")) is None
    assert ema_update(2.0, float("inf")) == 2.0
    assert ema_update(2.0, torch.tensor(4.0), decay=0.5) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="decay"):
        ema_update(1.0, 1.0, decay=1.5)


def test_collapse_metrics_keys_and_consistency():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(6, 3, 6, generator=g) * 5
    lengths = torch.randint(1, 20, (6, 3), generator=g)
    m = collapse_metrics(s, lengths=lengths, n_perm=16, seed=0)
    expected = {
        "mi", "mi_per_token", "mi_upper_bound", "retrieval_acc", "retrieval_chance", "cond_entropy",
        "marginal_entropy", "cond_entropy_per_token", "marginal_entropy_per_token",
        "mi_zscore", "mi_zscore_seq", "marginal_std", "marginal_std_seq", "marginal_std_ema",
        "marginal_std_ema_seq", "mi_zscore_ema", "mi_zscore_ema_seq",
        "mi_perm_zscore", "mi_perm_zscore_per_token", "mi_perm_zscore_ema",
    }
    assert set(m) == expected
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    seq = mi_from_scores(s)
    tok = mi_from_scores(s, lengths=lengths, per_token=True)
    assert m["mi"] == seq["mi"] and m["mi_per_token"] == tok["mi"]
    assert m["cond_entropy_per_token"] == tok["cond_entropy"]
    assert m["marginal_entropy_per_token"] == tok["marginal_entropy"]
    assert m["mi_perm_zscore"] == mi_zscore(s, n_perm=16, seed=0)["zscore"]
    # The EMAs start at the first value: the EMA z-score equals the z-score at the first measurement.
    assert m["mi_perm_zscore_ema"] == m["mi_perm_zscore"]
    assert m["marginal_std_ema"] == m["marginal_std"] and m["mi_zscore_ema"] == pytest.approx(m["mi_zscore"])
    assert m["mi_zscore_ema_seq"] == pytest.approx(m["mi_zscore_seq"])
    # Per-token MI over non-empty samples (all are here) is the release z-score's numerator.
    assert m["mi_zscore"] == pytest.approx(tok["mi"] / (m["marginal_std"] + 1e-3))
    # Dividing a row by a positive length does not move its argmax.
    assert tok["retrieval_acc"] == m["retrieval_acc"]


# ---------------------------------------------------------------- the release's z-score

def test_release_zscore_by_hand():
    # N = 2, K = 1, lengths 1 (per-token = per-sequence). Scores (row = sample, col = prompt):
    #   z_0: [-1, -3], z_1: [-2, -2]
    # matched  = [-1, -2]
    # marginal = logsumexp(row) - log 2: z_0: log((e^-1 + e^-3) / 2) = -1 + log((1 + e^-2) / 2)
    #            = -1 + log(0.567668) = -1.566219; z_1: log((e^-2 + e^-2) / 2) = -2
    # gaps = [0.566219, 0]; mean gap 0.283110
    # population std of marginals [-1.566219, -2]: |difference| / 2 = 0.216891
    # mi_zscore = 0.283110 / (0.216891 + 0.001) = 1.299314
    s = torch.tensor([[[-1.0, -3.0]], [[-2.0, -2.0]]])
    lengths = torch.tensor([[1], [1]])
    z = release_zscores(s, lengths=lengths)
    assert z["marginal_std"] == pytest.approx(0.216891, abs=1e-6)
    assert z["mi_gap"] == pytest.approx(0.283110, abs=1e-6)
    assert z["mi_zscore"] == pytest.approx(1.299314, abs=1e-5)
    assert z["mi_zscore_seq"] == pytest.approx(z["mi_zscore"])  # lengths 1
    # Lengths [4, 1]: per-token z_0 scores are [-0.25, -0.75] -> marginal -0.25 + log((1 + e^-0.5)/2)
    # = -0.25 + log(0.803265) = -0.25 - 0.219064 = -0.469064, gap 0.219064; z_1 unchanged (gap 0, marginal -2).
    # mean gap 0.109532; std |-0.469064 + 2| / 2 = 0.765468; z = 0.109532 / 0.766468 = 0.142905
    z = release_zscores(s, lengths=torch.tensor([[4], [1]]))
    assert z["mi_zscore"] == pytest.approx(0.142905, abs=1e-5)
    assert z["mi_zscore_seq"] == pytest.approx(1.299314, abs=1e-5)  # sums are the raw scores


def test_release_zscore_skips_empty_reasonings():
    # A third sample with an empty reasoning (length 0, scores 0) is left out, as the release does:
    # the statistics equal those of the first two samples alone.
    s = torch.tensor([[[-1.0, -3.0], [0.0, 0.0]], [[-2.0, -2.0], [-2.0, -2.0]]])
    lengths = torch.tensor([[1, 0], [1, 1]])
    z = release_zscores(s, lengths=lengths)
    # samples: z_00 (gap .566219, marginal -1.566219), z_10 and z_11 (gap 0, marginal -2)
    # mean gap .188740; population std of [-1.566219, -2, -2]: mean -1.855406,
    # deviations [.289187, -.144594, -.144594], var (.083629 + .020907 + .020907) / 3 = .041814, std .204485
    assert z["mi_gap"] == pytest.approx(0.188740, abs=1e-6)
    assert z["marginal_std"] == pytest.approx(0.204485, abs=1e-5)
    assert z["mi_zscore"] == pytest.approx(0.188740 / 0.205485, abs=1e-5)
    none = release_zscores(torch.zeros(2, 1, 2), lengths=torch.zeros(2, 1, dtype=torch.long))
    assert math.isnan(none["mi_zscore"]) and math.isnan(none["marginal_std"])


def test_release_zscore_drops_the_prompt_of_a_group_whose_reasonings_are_all_empty():
    # 3 prompts, 2 samples each; group 2's reasonings are both empty, so (as in the release) prompt 2
    # is no column of the marginal either: N' = 2, marginal = logsumexp over prompts 0, 1 - log 2.
    # Kept rows (scores under prompts 0, 1; column 2 holds -5 and would count without the rule):
    #   z00 [-1, -3]: matched -1, lse -0.873072, marginal -1.566219, gap 0.566219
    #   z01 [-2, -2]: matched -2, marginal -2.000000, gap 0
    #   z10 [-3, -1]: matched -1, marginal -1.566219, gap 0.566219
    #   z11 [-3, -2]: matched -2, lse -1.686738, marginal -2.379885, gap 0.379885
    # mean gap 0.378081; marginals' mean -1.878081, deviations [.311862, -.121919, .311862, -.501804],
    # population var (.097258 + .014864 + .097258 + .251807) / 4 = .115297, std .339554
    # mi_zscore = 0.378081 / (0.339554 + 0.001) = 1.110194 (lengths 1: per token = per sequence)
    s = torch.tensor([[[-1.0, -3.0, -5.0], [-2.0, -2.0, -5.0]],
                      [[-3.0, -1.0, -5.0], [-3.0, -2.0, -5.0]],
                      [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    lengths = torch.tensor([[1, 1], [1, 1], [0, 0]])
    z = release_zscores(s, lengths=lengths)
    assert z["mi_gap"] == pytest.approx(0.378081, abs=1e-6)
    assert z["marginal_std"] == pytest.approx(0.339554, abs=1e-6)
    assert z["mi_zscore"] == pytest.approx(1.110194, abs=1e-5) and z["mi_zscore_seq"] == pytest.approx(z["mi_zscore"])
    # Keeping prompt 2's column (-5 for every kept reasoning) would lower every marginal and give another value.
    kept = release_zscores(s[:2, :, :2], lengths=lengths[:2])
    assert kept["mi_zscore"] == pytest.approx(z["mi_zscore"])
    # One prompt with a reasoning left: no statistic (the release logs nothing below 2 prompts).
    one = release_zscores(s, lengths=torch.tensor([[1, 1], [0, 0], [0, 0]]))
    assert math.isnan(one["mi_zscore"])


def test_release_zscore_edge_cases():
    # Input-independent samples: every column equal -> gaps 0 -> z = 0 whatever the std.
    s = torch.tensor([[[-1.0, -1.0]], [[-4.0, -4.0]]])
    assert release_zscores(s, lengths=torch.ones(2, 1))["mi_zscore"] == 0.0
    # One-to-one mapping: matched 0, others -1e4 -> gap log 2 per sample; marginals both -log 2 -> std 0,
    # so z = log 2 / 1e-3 (the eps is the whole denominator).
    s = one_to_one_scores(n=2, k=1)
    z = release_zscores(s, lengths=torch.ones(2, 1))
    assert z["marginal_std"] == 0.0
    assert z["mi_zscore"] == pytest.approx(math.log(2) / 1e-3)


def test_release_zscore_ema_divides_by_an_ema_of_the_std():
    # Two measurements. First: the by-hand batch above (std .216891, gap .283110). Second: the same
    # scores doubled -> marginals of 2x: z_0 -2 + log((1 + e^-4)/2) = -2.684135, z_1 -4; gap .658 ...
    s1 = torch.tensor([[[-1.0, -3.0]], [[-2.0, -2.0]]])
    s2 = 2 * s1
    ones = torch.ones(2, 1, dtype=torch.long)
    m1 = collapse_metrics(s1, lengths=ones, n_perm=4, seed=0)
    m2 = collapse_metrics(s2, lengths=ones, n_perm=4, seed=0, ema=ema_state(m1), ema_decay=0.9)
    r2 = release_zscores(s2, lengths=ones)
    # EMA std = 0.9 * std1 + 0.1 * std2; the EMA z-score is this step's mean gap over it (+ eps).
    ema_std = 0.9 * m1["marginal_std"] + 0.1 * r2["marginal_std"]
    assert m2["marginal_std_ema"] == pytest.approx(ema_std)
    assert m2["mi_zscore_ema"] == pytest.approx(r2["mi_gap"] / (ema_std + 1e-3))
    # ... which is not the EMA of the z-scores.
    assert m2["mi_zscore_ema"] != pytest.approx(0.9 * m1["mi_zscore"] + 0.1 * m2["mi_zscore"])
    assert m2["mi_perm_zscore_ema"] == pytest.approx(0.9 * m1["mi_perm_zscore"] + 0.1 * m2["mi_perm_zscore"])


def test_accepts_numpy_and_ignores_grad():
    np = pytest.importorskip("numpy")
    arr = [[[-1.0, -2.0]], [[-3.0, -1.0]]]
    assert mi_from_scores(np.array(arr))["mi"] == pytest.approx(0.47305233, abs=1e-6)
    t = torch.tensor(arr, requires_grad=True)
    assert mi_from_scores(t)["mi"] == pytest.approx(0.47305233, abs=1e-6)
