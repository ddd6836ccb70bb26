"""Advantage estimators on tiny tensors with hand-derived expectations."""
import math

import torch

from ragen2_core.algo.advantages import (
    broadcast_to_tokens,
    gae_advantages,
    group_advantages,
    whiten,
)

R2 = 1 / math.sqrt(2)  # 0.70711


def close(a, b, atol=1e-5):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=atol)


# ---------------------------------------------------------------- GAE
def test_gae_gamma_lam_one_is_return_to_go_minus_value():
    # rewards [0, 0, 1], values 0.5 each, gamma = lam = 1:
    # return-to-go = [1, 1, 1] -> adv = [0.5, 0.5, 0.5], returns = [1, 1, 1]
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    mask = torch.ones(1, 3)
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert close(adv, [[0.5, 0.5, 0.5]])
    assert close(ret, [[1.0, 1.0, 1.0]])


def test_gae_lambda_half():
    # rewards [0, 1], values [0.5, 0.25], gamma 1, lam 0.5:
    # t=1: delta = 1 - 0.25 = 0.75, gae = 0.75
    # t=0: delta = 0 + 0.25 - 0.5 = -0.25, gae = -0.25 + 0.5 * 0.75 = 0.125
    # returns = adv + values = [0.625, 1.0]
    adv, ret = gae_advantages(
        torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), gamma=1.0, lam=0.5
    )
    assert close(adv, [[0.125, 0.75]])
    assert close(ret, [[0.625, 1.0]])


def test_gae_skips_env_tokens_multi_turn():
    # mask [1,1,0,0,1,1]: turn 1 = tokens 0-1 (reward 1 on token 1), env tokens 2-3, turn 2 = tokens 4-5
    # (reward 2 on token 5). Env values 9 and env reward 7 must be ignored. gamma 0.5, lam 1.
    # Response chain: r = [0, 1, 0, 2], v = [1, 2, 3, 4]
    # t=5: delta = 2 + 0.5*0 - 4 = -2;               gae = -2
    # t=4: delta = 0 + 0.5*4 - 3 = -1;               gae = -1 + 0.5*(-2) = -2
    # t=1: delta = 1 + 0.5*3 - 2 = 0.5 (next = v4);  gae = 0.5 + 0.5*(-2) = -0.5
    # t=0: delta = 0 + 0.5*2 - 1 = 0;                gae = 0 + 0.5*(-0.5) = -0.25
    # returns = adv + v = [0.75, 1.5, 0, 0, 1, 2] (= discounted return-to-go since lam = 1)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 1.0, 7.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[1.0, 2.0, 9.0, 9.0, 3.0, 4.0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=1.0)
    assert close(adv, [[-0.25, -0.5, 0.0, 0.0, -2.0, -2.0]])
    assert close(ret, [[0.75, 1.5, 0.0, 0.0, 1.0, 2.0]])


def test_gae_fully_masked_row_and_batch_independence():
    # Row 0 as in test_gae_lambda_half (padded with a trailing prompt token), row 1 fully masked.
    rewards = torch.tensor([[0.0, 1.0, 5.0], [1.0, 2.0, 3.0]])
    values = torch.tensor([[0.5, 0.25, 8.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.5)
    assert close(adv, [[0.125, 0.75, 0.0], [0.0, 0.0, 0.0]])
    assert close(ret, [[0.625, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


def test_gae_matches_compacted_reference():
    # Dropping the non-response tokens and running plain GAE must give the same numbers.
    g = torch.Generator().manual_seed(0)
    B, T, gamma, lam = 3, 9, 0.9, 0.8
    mask = torch.rand(B, T, generator=g) > 0.4
    rewards = torch.randn(B, T, generator=g) * mask
    values = torch.randn(B, T, generator=g)
    adv, _ = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    for b in range(B):
        idx = mask[b].nonzero().flatten().tolist()
        r, v = rewards[b, idx].tolist(), values[b, idx].tolist()
        expect, last, nxt = [0.0] * len(idx), 0.0, 0.0
        for i in reversed(range(len(idx))):
            last = r[i] + gamma * nxt - v[i] + gamma * lam * last
            expect[i], nxt = last, v[i]
        assert close(adv[b, idx], expect)
        assert (adv[b, ~mask[b]] == 0).all()


# ---------------------------------------------------------------- group advantages
def test_grpo_single_group():
    # [1, 2, 3]: mean 2, std(ddof=1) = 1 -> adv = [-1, 0, 1] / (1 + 1e-6)
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0]), norm_by_std=True)
    assert close(adv, [-1.0, 0.0, 1.0])


def test_grpo_and_drgrpo_two_interleaved_groups():
    # ids [7, 3, 7, 3], rewards [0, 1, 4, 3]
    # group 7: [0, 4], mean 2, std = sqrt((4 + 4) / 1) = 2*sqrt(2) -> [-2, 2] / 2.828 = [-0.7071, 0.7071]
    # group 3: [1, 3], mean 2, std = sqrt((1 + 1) / 1) = sqrt(2)  -> [-1, 1] / 1.414 = [-0.7071, 0.7071]
    reward, ids = torch.tensor([0.0, 1.0, 4.0, 3.0]), torch.tensor([7, 3, 7, 3])
    assert close(group_advantages(reward, ids, norm_by_std=True), [-R2, -R2, R2, R2])
    # Dr.GRPO: centred only -> [0-2, 1-2, 4-2, 3-2] = [-2, -1, 2, 1]
    assert close(group_advantages(reward, ids, norm_by_std=False), [-2.0, -1.0, 2.0, 1.0])


def test_grpo_ddof_zero():
    # [1, 3]: mean 2, std(ddof=0) = sqrt((1 + 1) / 2) = 1 -> adv = [-1, 1]
    adv = group_advantages(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]), norm_by_std=True, std_ddof=0)
    assert close(adv, [-1.0, 1.0])


def test_group_size_one_gives_zero():
    # id 0 alone -> 0; group 1 = [1, 3] -> GRPO [-0.7071, 0.7071], Dr.GRPO [-1, 1]
    reward, ids = torch.tensor([5.0, 1.0, 3.0]), torch.tensor([0, 1, 1])
    for norm, expect in ((True, [0.0, -R2, R2]), (False, [0.0, -1.0, 1.0])):
        adv = group_advantages(reward, ids, norm_by_std=norm)
        assert torch.isfinite(adv).all()
        assert close(adv, expect)
    assert group_advantages(torch.tensor([4.0]), torch.tensor([0]), norm_by_std=True).item() == 0.0


def test_zero_spread_group_is_exactly_zero():
    # 0.1 * 3 / 3 is not exactly 0.1 in floating point; the advantage must still be exactly 0, not NaN
    # and not round-off divided by eps.
    reward, ids = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0]), torch.tensor([0, 0, 0, 1, 1])
    for norm in (True, False):
        adv = group_advantages(reward, ids, norm_by_std=norm)
        assert (adv[:3] == 0).all()
        assert torch.isfinite(adv).all()


def test_broadcast_to_tokens():
    # seq_adv [2, -1], mask [[1,1,0],[0,1,1]] -> [[2,2,0],[0,-1,-1]]
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert out.shape == (2, 3)
    assert close(out, [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]])


def test_whiten_unbiased_and_population():
    # x = [1, 2, 3, 6] all masked: mean 3, deviations [-2, -1, 0, 3], sum of squares 14
    # unbiased var 14 / 3 = 4.66667 (veRL) -> [-2, -1, 0, 3] / 2.16025 = [-.92582, -.46291, 0, 1.38873]
    # population var 14 / 4 = 3.5 -> / 1.87083 = [-1.06904, -.53452, 0, 1.60357]
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    mask = torch.ones(2, 2)
    assert torch.allclose(whiten(x, mask), torch.tensor([[-0.92582, -0.46291], [0.0, 1.38873]]), atol=1e-5)
    assert torch.allclose(whiten(x, mask, unbiased=False), torch.tensor([[-1.06904, -0.53452], [0.0, 1.60357]]),
                          atol=1e-5)
    # Masked-out entries neither count nor survive: [1, 2, 3, (100)] -> mean 2, unbiased var 1 -> [-1, 0, 1, 0]
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert torch.allclose(whiten(x, m), torch.tensor([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-5)
    # A single masked entry: variance taken as 0, the entry becomes 0 (never NaN); no entry: all zeros.
    one = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    assert whiten(x, one).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert whiten(x, torch.zeros(2, 2)).tolist() == [[0.0, 0.0], [0.0, 0.0]]
