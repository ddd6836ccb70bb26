"""SNR-aware group filter on tiny score vectors with hand-derived selections."""
import math

import pytest
import torch

from ragen2_core.algo.filter import (group_reward_stats, loss_scale_factor, select_groups, soft_group_weights,
                                     zero_spread)


def rows_with_std(stds):
    """Groups [-s, 0, s]: std(ddof=1) = sqrt((s^2 + 0 + s^2) / 2) = s, var = s^2."""
    return torch.tensor([[-s, 0.0, s] for s in stds], dtype=torch.float64)


def kept(mask):
    return mask.nonzero().flatten().tolist()


# Scores [1, 4, 0, 3, 2], total 10; descending order idx 1, 3, 4, 0, 2 with cumulative 4, 7, 9, 10, 10.
SCORES = rows_with_std([1.0, 4.0, 0.0, 3.0, 2.0])


def test_group_reward_stats():
    # [0, 1]: mean .5, var = (.25 + .25) / 1 = .5, std .70711; [1, 1]: 0; [0, 2]: var (1 + 1) / 1 = 2
    r = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 2.0]])
    assert torch.allclose(group_reward_stats(r, statistic="var"), torch.tensor([0.5, 0.0, 2.0], dtype=torch.float64))
    assert torch.allclose(group_reward_stats(r, statistic="std"), torch.tensor([0.70711, 0.0, 1.41421], dtype=torch.float64), atol=1e-5)
    # Group size 1 -> 0, not NaN
    assert (group_reward_stats(torch.tensor([[3.0], [5.0]]), statistic="std") == 0).all()
    with pytest.raises(ValueError):
        group_reward_stats(r, statistic="mad")


def test_top_p_linear():
    # 0.9: threshold 9 - 0.01 = 8.99 -> prefix of 3 (cum 9) -> idx {1, 3, 4}
    m = select_groups(SCORES, strategy="top_p", value=0.9)
    assert m.dtype == torch.bool and m.shape == (5,)
    assert m.tolist() == [False, True, False, True, True]
    # 0.7: threshold 6.99 -> cum 7 after 2 -> {1, 3}; 0.5: threshold 4.99 -> cum 4 < 4.99 -> 2 -> {1, 3}
    assert kept(select_groups(SCORES, strategy="top_p", value=0.7)) == [1, 3]
    assert kept(select_groups(SCORES, strategy="top_p", value=0.5)) == [1, 3]
    # 0.3: threshold 2.99 -> cum 4 after 1 -> {1}
    assert kept(select_groups(SCORES, strategy="top_p", value=0.3)) == [1]


def test_top_p_linear_eps_tolerance():
    # 0.7009: threshold 7.009 - 0.01 = 6.999 -> 2 groups; with eps 0 threshold 7.009 -> 3 groups
    assert kept(select_groups(SCORES, strategy="top_p", value=0.7009)) == [1, 3]
    assert kept(select_groups(SCORES, strategy="top_p", value=0.7009, eps=0.0)) == [1, 3, 4]


def test_top_p_one_is_no_filter():
    # The "nofilter" arm: every group kept, zero-spread ones included, in both modes.
    for mode in ("linear", "softmax"):
        assert select_groups(SCORES, strategy="top_p", value=1.0, mode=mode).all()
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (16, 4), generator=g).float()  # many all-0 / all-1 groups
    for mode in ("linear", "softmax"):
        assert select_groups(rewards, strategy="top_p", value=1.0, mode=mode).all()
    # include_zero=False with top_p 1.0 is a different arm: zero-spread group 2 is dropped
    assert kept(select_groups(SCORES, strategy="top_p", value=1.0, include_zero=False)) == [0, 1, 3, 4]


def test_all_zero_spread():
    flat = torch.ones(3, 4)
    # top_p 1.0 keeps everything in both modes; include_zero=False drops every group.
    for mode in ("linear", "softmax"):
        assert select_groups(flat, strategy="top_p", value=1.0, mode=mode).all()
        for value in (0.5, 0.9, 1.0):
            assert not select_groups(flat, strategy="top_p", value=value, mode=mode, include_zero=False).any()
    # Linear below 1: total 0, threshold 0.9 * 0 - 0.01 < 0 is met by the empty prefix -> nothing kept
    # (the release's empty filter).
    for value in (0.5, 0.9):
        assert not select_groups(flat, strategy="top_p", value=value, mode="linear").any()
    # Softmax over three zeros is uniform [1/3, 1/3, 1/3], cum [.333, .667, 1]: 0.5 -> 2 groups, 0.9 -> 3
    assert kept(select_groups(flat, strategy="top_p", value=0.5, mode="softmax")) == [0, 1]
    assert kept(select_groups(flat, strategy="top_p", value=0.9, mode="softmax")) == [0, 1, 2]
    # Group size 1: every score is 0, same outcome
    single = torch.tensor([[1.0], [2.0], [3.0]])
    assert select_groups(single, strategy="top_p", value=1.0).all()
    assert not select_groups(single, strategy="top_p", value=0.9).any()
    assert not select_groups(single, strategy="top_p", value=0.9, include_zero=False).any()


def test_linear_top_p_empty_when_threshold_not_positive():
    # [[0, 0.01], [1, 1], [0, 0]]: stds [0.00707, 0, 0], total 0.00707; 0.9 * 0.00707 - 0.01 = -0.0036 <= 0
    # -> nothing kept (the release returns an empty selection here).
    r = torch.tensor([[0.0, 0.01], [1.0, 1.0], [0.0, 0.0]])
    assert not select_groups(r, strategy="top_p", value=0.9, mode="linear").any()
    # Spread 1 instead: stds [0.7071, 0, 0], threshold 0.9 * 0.7071 - 0.01 = 0.626 -> group 0 alone.
    r = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    assert kept(select_groups(r, strategy="top_p", value=0.9, mode="linear")) == [0]


def test_zero_spread_is_exact_on_float32_rewards():
    # float32 [0.9] * 8 and [10.7] * 8 have computed stds of ~6e-8 and ~1e-6 (mean round-off), yet
    # all rewards are equal: zero spread, score exactly 0, dropped by include_zero=False.
    r = torch.tensor([[0.9] * 8, [10.7] * 8, [0.0] * 7 + [1.0]], dtype=torch.float32)
    assert zero_spread(r).tolist() == [True, True, False]
    assert group_reward_stats(r, statistic="std")[:2].tolist() == [0.0, 0.0]
    # the last group: mean 1/8, var = (7 * (1/8)^2 + (7/8)^2) / 7 = (7/64 + 49/64) / 7 = 1/8, std 0.35355
    assert group_reward_stats(r, statistic="std")[2].item() == pytest.approx(0.35355, abs=1e-5)
    assert kept(select_groups(r, strategy="top_p", value=1.0, include_zero=False)) == [2]
    assert kept(select_groups(r, strategy="top_k_abs", value=3, include_zero=False)) == [2]


def test_top_p_softmax():
    # scores [0, ln 2, ln 5] -> softmax = [1, 2, 5] / 8 = [.125, .25, .625]
    # descending: idx 2 (.625), idx 1 (cum .875), idx 0 (cum 1.0); no eps in softmax mode
    rewards = rows_with_std([0.0, math.log(2.0), math.log(5.0)])
    sel = lambda v, **kw: kept(select_groups(rewards, strategy="top_p", value=v, mode="softmax", **kw))  # noqa: E731
    assert sel(0.6) == [2]  # .625 >= .6
    assert sel(0.625) == [2]  # reached exactly
    assert sel(0.8) == [1, 2]  # .875 >= .8
    assert sel(0.875) == [1, 2]
    assert sel(0.88) == [0, 1, 2]  # .875 < .88 (an eps of 0.01 would have stopped at 2 groups)
    # include_zero=False: softmax over [ln 2, ln 5] only = [2, 5] / 7 = [.2857, .7143]
    assert sel(0.7, include_zero=False) == [2]
    assert sel(0.72, include_zero=False) == [1, 2]


def test_paper_preset_softmax_keeps_what_the_release_keeps():
    # [-2.53, 1.73, 1.28, 1.96]: mean .61, squared deviations 9.8596 + 1.2544 + .4489 + 1.8225 = 13.3854,
    # var 13.3854 / 3 = 4.4618, std 2.11229; [-1.48] * 4: std 0.
    # softmax([2.11229, 0]) = [e^2.11229, 1] / (e^2.11229 + 1) = [8.2674, 1] / 9.2674 = [.89210, .10790]
    # cum .89210 < 0.9 -> both groups (an eps of 0.01 would have stopped at .89 with one).
    r = torch.tensor([[-2.53, 1.73, 1.28, 1.96], [-1.48] * 4])
    assert select_groups(r, strategy="top_p", value=0.9, mode="softmax").tolist() == [True, True]
    assert kept(select_groups(r, strategy="top_p", value=0.89, mode="softmax")) == [0]


def test_statistic_changes_selection():
    # std [1, 3, 2] -> var [1, 9, 4]; top_p 0.6 linear
    # std: total 6, threshold 3.59: 3 < 3.59, 3 + 2 = 5 -> idx {1, 2}
    # var: total 14, threshold 8.39: 9 -> idx {1}
    rewards = rows_with_std([1.0, 3.0, 2.0])
    assert kept(select_groups(rewards, strategy="top_p", value=0.6, statistic="std")) == [1, 2]
    assert kept(select_groups(rewards, strategy="top_p", value=0.6, statistic="var")) == [1]


def test_ties_broken_by_lower_index():
    # scores [2, 2, 1, 2]: stable descending order idx 0, 1, 3, 2
    rewards = rows_with_std([2.0, 2.0, 1.0, 2.0])
    assert kept(select_groups(rewards, strategy="top_k_abs", value=2)) == [0, 1]
    # linear top_p 0.5: total 7, threshold 3.49 -> cum 2, 4 -> idx {0, 1}
    assert kept(select_groups(rewards, strategy="top_p", value=0.5)) == [0, 1]


def test_top_k_fraction_truncates():
    rewards = rows_with_std([1.0, 4.0, 3.0, 2.0])  # order idx 1, 2, 3, 0
    # G = 4, k = int(value * 4): 0.5 -> 2; 0.75 -> 3; 0.375 -> int(1.5) = 1; 0.1 -> 0 -> at least 1; 1.0 -> 4
    assert kept(select_groups(rewards, strategy="top_k", value=0.5)) == [1, 2]
    assert kept(select_groups(rewards, strategy="top_k", value=0.75)) == [1, 2, 3]
    assert kept(select_groups(rewards, strategy="top_k", value=0.375)) == [1]
    assert kept(select_groups(rewards, strategy="top_k", value=0.1)) == [1]
    assert select_groups(rewards, strategy="top_k", value=1.0).all()
    # G = 2 at 0.75: int(1.5) = 1 group, as the release (rounding half up would keep 2)
    assert kept(select_groups(rows_with_std([1.0, 2.0]), strategy="top_k", value=0.75)) == [1]
    # With a zero-spread group removed only 4 candidates of G = 5 remain: 1.0 * 5 = 5 -> capped at 4
    assert kept(select_groups(SCORES, strategy="top_k", value=1.0, include_zero=False)) == [0, 1, 3, 4]


def test_top_k_abs():
    # SCORES order idx 1, 3, 4, 0, 2: k = 3 -> {1, 3, 4}; 2.9 -> int 2 -> {1, 3}; 10 -> all 5
    assert kept(select_groups(SCORES, strategy="top_k_abs", value=3)) == [1, 3, 4]
    assert kept(select_groups(SCORES, strategy="top_k_abs", value=2.9)) == [1, 3]
    assert select_groups(SCORES, strategy="top_k_abs", value=10).all()


def test_min_p():
    # max 4: 0.5 -> keep score >= 2 -> {1, 3, 4}; 1.0 -> only the max {1}; 0 -> all (incl. zero spread)
    assert kept(select_groups(SCORES, strategy="min_p", value=0.5)) == [1, 3, 4]
    assert kept(select_groups(SCORES, strategy="min_p", value=1.0)) == [1]
    assert select_groups(SCORES, strategy="min_p", value=0.0).all()
    assert kept(select_groups(SCORES, strategy="min_p", value=0.0, include_zero=False)) == [0, 1, 3, 4]


def draw(seed):
    return torch.Generator().manual_seed(seed)


def test_random_pick_keeps_as_many_as_the_filter_from_the_same_candidates():
    # SCORES [1, 4, 0, 3, 2]: linear top_p 0.6 -> threshold 5.99, cum 4, 7 -> 2 groups {1, 3};
    # min_p 0.5 keeps 3 ({1, 3, 4}); top_k_abs 1 keeps 1. The random pick keeps the same counts.
    for kw, n in (({"strategy": "top_p", "value": 0.6}, 2), ({"strategy": "min_p", "value": 0.5}, 3),
                  ({"strategy": "top_k_abs", "value": 1}, 1)):
        assert len(kept(select_groups(SCORES, **kw))) == n
        assert len(kept(select_groups(SCORES, **kw, pick="random", generator=draw(0)))) == n
    # include_zero=False: group 2 (zero spread) is no candidate, so no draw of 2 ever keeps it,
    # while over 50 draws every other group is kept at least once
    seen = set()
    for seed in range(50):
        picked = kept(select_groups(SCORES, strategy="top_k_abs", value=2, include_zero=False, pick="random",
                                    generator=draw(seed)))
        assert len(picked) == 2 and 2 not in picked
        seen |= set(picked)
    assert seen == {0, 1, 3, 4}
    # top_p = 1.0 keeps every candidate: random or not, it is no filter
    assert select_groups(SCORES, strategy="top_p", value=1.0, pick="random", generator=draw(0)).all()


def test_random_pick_is_uniform_over_the_candidates_and_reproducible():
    # Keeping 1 of 5 at random: each group about 1/5 of 2,000 draws (SD sqrt(2000 * .2 * .8) = 18),
    # the zero-spread group 2 included, though the filter itself would always keep group 1.
    counts = [0] * 5
    for seed in range(2000):
        counts[kept(select_groups(SCORES, strategy="top_k_abs", value=1, pick="random", generator=draw(seed)))[0]] += 1
    assert all(abs(c - 400) < 100 for c in counts), counts
    a = select_groups(SCORES, strategy="top_k_abs", value=2, pick="random", generator=draw(7))
    b = select_groups(SCORES, strategy="top_k_abs", value=2, pick="random", generator=draw(7))
    assert torch.equal(a, b)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="pick"):
        select_groups(SCORES, strategy="top_p", value=0.9, pick="smallest")
    for kw in ({"strategy": "bottom"}, {"mode": "exp"}, {"value": -0.1}):
        args = {"strategy": "top_p", "value": 0.9, **kw}
        with pytest.raises(ValueError):
            select_groups(SCORES, **args)


def test_loss_scale_factor():
    # kept 0.25: none -> 1, linear -> 0.25, sqrt -> 0.5
    assert loss_scale_factor(0.25, mode="none") == 1.0
    assert loss_scale_factor(0.25, mode="linear") == 0.25
    assert loss_scale_factor(0.25, mode="sqrt") == 0.5
    assert loss_scale_factor(1.0, mode="sqrt") == 1.0
    with pytest.raises(ValueError):
        loss_scale_factor(0.5, mode="cube")
    with pytest.raises(ValueError):
        loss_scale_factor(1.5, mode="linear")


def test_soft_group_weights_scale_by_spread_over_the_max():
    # stds [1, 4, 0, 3, 2] -> weights std / 4 = [.25, 1, 0, .75, .5]
    w = soft_group_weights(SCORES, statistic="std")
    assert torch.allclose(w, torch.tensor([0.25, 1.0, 0.0, 0.75, 0.5], dtype=torch.float64))
    # var: [1, 16, 0, 9, 4] / 16
    w = soft_group_weights(SCORES, statistic="var")
    assert torch.allclose(w, torch.tensor([1 / 16, 1.0, 0.0, 9 / 16, 4 / 16], dtype=torch.float64))


def test_soft_group_weights_all_zero_spread_is_all_ones():
    # Nothing to rank by: weights are 1 rather than 0/0.
    assert soft_group_weights(torch.ones(3, 4), statistic="std").tolist() == [1.0, 1.0, 1.0]
