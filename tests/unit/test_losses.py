"""Loss functions on tiny tensors with hand-derived expectations."""
import math

import pytest
import torch

from ragen2_core.algo.losses import (
    aggregate,
    entropy_from_logits,
    kl_penalty,
    logp_from_logits,
    policy_loss,
    value_loss,
)

LN2 = math.log(2.0)


def close(a, b, atol=1e-5):
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), atol=atol)


# ---------------------------------------------------------------- aggregate
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_aggregate_modes():
    # token-mean: (1 + 2 + 4) / 3 = 7/3
    assert close(aggregate(LOSS, MASK, mode="token-mean"), 7 / 3)
    # seq-mean-token-mean: rows [1.5, 4] -> 2.75
    assert close(aggregate(LOSS, MASK, mode="seq-mean-token-mean"), 2.75)
    # seq-mean-token-sum: rows [3, 4] -> 3.5; norm_len 2 -> rows [1.5, 2] -> 1.75
    assert close(aggregate(LOSS, MASK, mode="seq-mean-token-sum"), 3.5)
    assert close(aggregate(LOSS, MASK, mode="seq-mean-token-sum", norm_len=2.0), 1.75)


def test_aggregate_fully_masked_row_no_nan():
    # Extra row full of NaN/inf padding and mask 0. token-mean and seq-mean-token-mean give the same
    # value as without it; seq-mean-token-sum (Dr.GRPO) divides by all 3 rows: (3 + 4 + 0) / 3.
    loss = torch.cat([LOSS, torch.tensor([[float("nan"), float("inf"), 7.0]])]).requires_grad_()
    mask = torch.cat([MASK, torch.zeros(1, 3)]).bool()
    for mode, expect in (("token-mean", 7 / 3), ("seq-mean-token-mean", 2.75), ("seq-mean-token-sum", 7 / 3)):
        out = aggregate(loss, mask, mode=mode)
        assert close(out, expect)
        (grad,) = torch.autograd.grad(out, loss)
        assert torch.isfinite(grad).all() and (grad[2] == 0).all()
    # Nothing masked in at all -> 0.
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert aggregate(LOSS, torch.zeros(2, 3), mode=mode).item() == 0.0


def test_aggregate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        aggregate(LOSS, MASK, mode="sum")
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(LOSS, MASK, mode="token-mean", norm_len=4.0)


# ---------------------------------------------------------------- policy loss
def test_policy_loss_hand_example():
    # clip range [0.8, 1.28]; per-token loss = max(-A*r, -A*clip(r)):
    # t0: r = 1,           A = 1  -> max(-1, -1)            = -1       (not clipped)
    # t1: r = e^0.5=1.6487, A = 1  -> max(-1.6487, -1.28)   = -1.28    (clipped)
    # t2: r = e^-0.5=0.6065, A = 1 -> max(-0.6065, -0.8)    = -0.6065  (not clipped)
    # t3: r = 0.6065,      A = -1 -> max(0.6065, 0.8)       = 0.8      (clipped)
    # t4: masked out (logp -inf must not matter)
    # token-mean = (-1 - 1.28 - 0.60653 + 0.8) / 4 = -0.52163; clipfrac 2/4
    # approx_kl = mean(old - logp) = mean(0, -0.5, 0.5, 0.5) = 0.125
    # ratio_mean = (1 + 1.64872 + 0.60653 + 0.60653) / 4 = 3.86178 / 4 = 0.96545
    logp = torch.tensor([[0.0, 0.5, -0.5, -0.5, -float("inf")]], requires_grad=True)
    old = torch.zeros(1, 5)
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    loss, stats = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg="token-mean")
    assert close(loss, -0.52163266)
    assert close(stats["clipfrac"], 0.5)
    assert close(stats["approx_kl"], 0.125)
    assert close(stats["ratio_mean"], 0.9654453)
    # d loss / d logp = -A * r / 4 on unclipped tokens, 0 on clipped and masked ones:
    # [-0.25, 0, -0.60653/4 = -0.15163, 0, 0]
    loss.backward()
    assert close(logp.grad, [[-0.25, 0.0, -0.1516327, 0.0, 0.0]])


def test_policy_loss_on_policy_is_minus_mean_advantage():
    # logp == old -> ratio 1 everywhere: loss = -mean(A) over mask, clipfrac 0, approx_kl 0.
    # seq-mean-token-mean: row0 A = [1, 3] -> -2, row1 A = [-1] -> 1 -> mean(-2, 1) = -0.5
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]])
    adv = torch.tensor([[1.0, 3.0], [-1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = policy_loss(logp, logp.clone(), adv, mask, clip_low=0.2, clip_high=0.2, agg="seq-mean-token-mean")
    assert close(loss, -0.5)
    assert stats["clipfrac"].item() == 0.0 and stats["approx_kl"].item() == 0.0
    assert close(stats["ratio_mean"], 1.0)


def test_dual_clip_caps_negative_advantage_tokens():
    # A = -1, r = 4 (logp - old = ln 4): clipped branch -A * clip(4, .8, 1.28) = 1.28, unclipped -A * 4 = 4,
    # PPO max = 4; dual clip c = 3 caps it at c * |A| = 3, with zero gradient (the cap does not depend on logp).
    # Without dual clip: loss 4, d loss / d logp = -A * r = 4.
    # A = +1, r = 4: max(-4, -1.28) = -1.28 either way (dual clip only touches A < 0).
    logp = torch.tensor([[math.log(4.0), math.log(4.0)]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2)
    kw = dict(clip_low=0.2, clip_high=0.28, agg="seq-mean-token-sum")
    loss, stats = policy_loss(logp, old, adv, mask, clip_ratio_c=3.0, **kw)
    assert close(loss, 3.0 - 1.28) and close(stats["clipfrac_lower"], 0.5)
    (grad,) = torch.autograd.grad(loss, logp)
    assert close(grad, [[0.0, 0.0]])
    loss, stats = policy_loss(logp, old, adv, mask, clip_ratio_c=None, **kw)
    assert close(loss, 4.0 - 1.28) and stats["clipfrac_lower"].item() == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    assert close(grad, [[4.0, 0.0]])
    # r = 2 < c: the cap 3 is above PPO's loss 2, nothing changes.
    loss, _ = policy_loss(torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1),
                          clip_ratio_c=3.0, **kw)
    assert close(loss, 2.0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(logp, old, adv, mask, clip_ratio_c=1.0, **kw)


def test_policy_loss_log_ratio_clamp():
    # logp - old = 30 is clamped to 20 before exp, as veRL does: r = e^20, finite; approx_kl = -20.
    _, stats = policy_loss(torch.tensor([[30.0]]), torch.zeros(1, 1), torch.tensor([[1.0]]), torch.ones(1, 1),
                           clip_low=0.2, clip_high=0.28, agg="token-mean")
    assert close(stats["ratio_mean"], math.exp(20.0)) and close(stats["approx_kl"], -20.0)


# ---------------------------------------------------------------- KL estimators
def test_k3_is_clamped_like_verl_low_var_kl():
    # d = logp - ref = -2.7: c = -d = 2.7, e^2.7 - 2.7 - 1 = 14.87973 - 3.7 = 11.17973 -> clamped to 10,
    # with zero gradient; k3_exact keeps 11.17973 and its gradient d/dlogp (e^-d + d - 1) = 1 - e^-d = -13.87973.
    # d = -25: c clamps to 20 first, e^20 - 21 -> 10. d = 1: e^-1 + 1 - 1 = 0.36788, inside the bounds.
    logp = torch.tensor([-2.7, -25.0, 1.0], requires_grad=True)
    ref = torch.zeros(3)
    k3 = kl_penalty(logp, ref, estimator="k3")
    assert close(k3, [10.0, 10.0, 0.36788])
    (grad,) = torch.autograd.grad(k3.sum(), logp)
    assert close(grad[:2], [0.0, 0.0])
    exact = kl_penalty(logp, ref, estimator="k3_exact")
    assert close(exact[0], 11.17973)
    (grad,) = torch.autograd.grad(exact[0], logp)
    assert close(grad[0], -13.87973)


def test_kl_hand_values():
    # d = logp - ref = [0, ln2, -ln2]
    # k1 = d                       = [0, 0.69315, -0.69315]
    # k2 = d^2 / 2                 = [0, 0.24023, 0.24023]
    # k3 = e^-d + d - 1            = [0, 0.5 + 0.69315 - 1 = 0.19315, 2 - 0.69315 - 1 = 0.30685]
    logp = torch.tensor([0.0, LN2, -LN2])
    ref = torch.zeros(3)
    assert close(kl_penalty(logp, ref, estimator="k1"), [0.0, 0.69315, -0.69315])
    assert close(kl_penalty(logp, ref, estimator="k2"), [0.0, 0.24023, 0.24023])
    assert close(kl_penalty(logp, ref, estimator="k3"), [0.0, 0.19315, 0.30685])
    assert close(kl_penalty(logp, ref, estimator="k3_exact"), [0.0, 0.19315, 0.30685])
    with pytest.raises(ValueError):
        kl_penalty(logp, ref, estimator="k4")


def test_kl_estimators_match_exact_kl_on_categoricals():
    # p = [0.5, 0.3, 0.2], q = [0.2, 0.4, 0.4]
    # KL(p||q) = 0.5 ln 2.5 + 0.3 ln 0.75 + 0.2 ln 0.5 = 0.45815 - 0.08630 - 0.13863 = 0.23321
    p, q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), torch.tensor([0.2, 0.4, 0.4], dtype=torch.float64)
    exact = float((p * (p / q).log()).sum())
    assert abs(exact - 0.23321) < 1e-4
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    logp, ref = p.log()[x], q.log()[x]
    # k1 and k3 are unbiased; the standard error at 200k samples is ~1e-3.
    assert abs(kl_penalty(logp, ref, estimator="k1").mean().item() - exact) < 0.01
    assert abs(kl_penalty(logp, ref, estimator="k3").mean().item() - exact) < 0.01
    # k2 is biased but close for nearby distributions: p = [0.5, 0.5], q = [0.45, 0.55]
    # KL = 0.5 ln(0.5/0.45) + 0.5 ln(0.5/0.55) = 0.05268 - 0.04766 = 0.00503
    # E[k2] = 0.5 * (0.5 * 0.10536^2 + 0.5 * 0.09531^2) = 0.00505 (exact expectation, enumerated)
    p2, q2 = torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([0.45, 0.55], dtype=torch.float64)
    exact2 = float((p2 * (p2 / q2).log()).sum())
    k2_mean = float((p2 * kl_penalty(p2.log(), q2.log(), estimator="k2")).sum())
    assert abs(exact2 - 0.00503) < 1e-4 and abs(k2_mean - exact2) < 0.05 * exact2


# ---------------------------------------------------------------- entropy / log-probs
def test_entropy_from_logits():
    # uniform over 4 -> ln 4 = 1.38629
    # [0, ln 3] -> p = [0.25, 0.75] -> H = 0.25 ln 4 + 0.75 ln(4/3) = 0.34657 + 0.21576 = 0.56233
    # [1000, 0] -> p = [1, ~0] -> H = 0 without overflow
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9], [1000.0, 0.0, -1e9, -1e9]]])
    h = entropy_from_logits(logits)
    assert h.shape == (1, 3)
    assert close(h, [[1.38629, 0.56233, 0.0]])


def test_entropy_with_neg_inf_logits_has_finite_grad():
    # [0, 0, -inf] -> p = [0.5, 0.5, 0] -> H = ln 2 = 0.69315
    logits = torch.tensor([[[0.0, 0.0, -float("inf")]]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert close(h, [[LN2]])
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_logp_from_logits():
    # [0, ln 3] -> p = [0.25, 0.75]: id 1 -> ln 0.75 = -0.28768, id 0 -> ln 0.25 = -1.38629
    # [1000, 1000] -> p = [0.5, 0.5]: id 0 -> ln 0.5 = -0.69315 (no overflow)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)], [1000.0, 1000.0]]])
    ids = torch.tensor([[1, 0, 0]])
    assert close(logp_from_logits(logits, ids), [[-0.28768, -1.38629, -LN2]])


# ---------------------------------------------------------------- value loss
def test_value_loss_clipping():
    # clip 0.5; loss per token = 0.5 * max((v-R)^2, (v_clip-R)^2), v_clip = old + clamp(v - old, +-0.5)
    # t0: v 1, old 0, R 0: unclipped 1, v_clip 0.5 -> 0.25  -> 1     (unclipped wins)
    # t1: v 2, old 2, R 3: unclipped 1, v_clip 2   -> 1     -> 1     (tie, not counted as clipped)
    # t2: v 1, old 0, R 2: unclipped 1, v_clip 0.5 -> 2.25  -> 2.25  (clipped wins)
    # t3: masked
    # token-mean: 0.5 * (1 + 1 + 2.25) / 3 = 0.70833; vf_clipfrac = 1/3
    values = torch.tensor([[1.0, 2.0, 1.0, 50.0]])
    old = torch.tensor([[0.0, 2.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 3.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    loss, stats = value_loss(values, old, returns, mask, clip=0.5, agg="token-mean")
    assert close(loss, 0.708333)
    assert close(stats["vf_clipfrac"], 1 / 3)
    # No clipping: 0.5 * (1 + 1 + 1) / 3 = 0.5
    loss, stats = value_loss(values, old, returns, mask, clip=None, agg="token-mean")
    assert close(loss, 0.5) and stats["vf_clipfrac"].item() == 0.0
