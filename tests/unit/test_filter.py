"""SNR-aware group filter on tiny score vectors with hand-derived selections."""
import math

import pytest
import torch

from ragen2_core.algo.filter import group_reward_stats, loss_scale_factor, select_groups, soft_group_weights


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
    assert torch.allclose(group_reward_stats(r, statistic="var"), torch.tensor([0.5, 0.0, 2.0]))
    assert torch.allclose(group_reward_stats(r, statistic="std"), torch.tensor([0.70711, 0.0, 1.41421]), atol=1e-5)
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
    for value in (0.5, 0.9, 1.0):
        for mode in ("linear", "softmax"):
            assert select_groups(flat, strategy="top_p", value=value, mode=mode).all()
            assert not select_groups(flat, strategy="top_p", value=value, mode=mode, include_zero=False).any()
    # Group size 1: every score is 0, same outcome
    single = torch.tensor([[1.0], [2.0], [3.0]])
    assert select_groups(single, strategy="top_p", value=0.9).all()
    assert not select_groups(single, strategy="top_p", value=0.9, include_zero=False).any()


def test_top_p_softmax():
    # scores [0, ln 2, ln 5] -> softmax = [1, 2, 5] / 8 = [.125, .25, .625]
    # descending: idx 2 (.625), idx 1 (cum .875), idx 0 (cum 1.0)
    rewards = rows_with_std([0.0, math.log(2.0), math.log(5.0)])
    sel = lambda v, **kw: kept(select_groups(rewards, strategy="top_p", value=v, mode="softmax", **kw))  # noqa: E731
    assert sel(0.6) == [2]  # threshold .59 reached by .625
    assert sel(0.8) == [1, 2]  # threshold .79 reached by .875
    assert sel(0.88) == [1, 2]  # threshold .87 <= .875 thanks to eps
    assert sel(0.9) == [0, 1, 2]  # threshold .89 > .875
    # include_zero=False: softmax over [ln 2, ln 5] only = [2, 5] / 7 = [.2857, .7143]
    assert sel(0.7, include_zero=False) == [2]  # threshold .69
    assert sel(0.8, include_zero=False) == [1, 2]


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


def test_top_k_fraction_round_half_up():
    rewards = rows_with_std([1.0, 4.0, 3.0, 2.0])  # order idx 1, 2, 3, 0
    # G = 4: 0.5 -> 2; 0.375 -> 1.5 -> 2; 0.3 -> 1.2 -> 1; 0.1 -> 0.4 -> 0 -> at least 1; 1.0 -> 4
    assert kept(select_groups(rewards, strategy="top_k", value=0.5)) == [1, 2]
    assert kept(select_groups(rewards, strategy="top_k", value=0.375)) == [1, 2]
    assert kept(select_groups(rewards, strategy="top_k", value=0.3)) == [1]
    assert kept(select_groups(rewards, strategy="top_k", value=0.1)) == [1]
    assert select_groups(rewards, strategy="top_k", value=1.0).all()
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


def test_rejects_bad_arguments():
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
