"""The actor objective assembled in one place (algo/objective.py), on hand-built tensors."""
import pytest
import torch

from ragen2_core.algo.objective import Objective, actor_terms, rewards_with_kl


def objective(**kw):
    base = dict(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, agg="token-mean", norm_len=None,
                entropy_coef=0.1, kl_coef=1.0, kl_estimator="k1", kl_placement="in_loss")
    return Objective(**(base | kw))


# One row, two reply tokens, on-policy (ratio 1), A = [1, 1]: pg = -mean(A) = -1.
LOGP = torch.log(torch.tensor([[0.5, 0.25]]))
ENT = torch.tensor([[1.0, 2.0]])                 # mean entropy 1.5
REF = LOGP - torch.tensor([[0.2, 0.4]])          # k1 = logp - ref = [.2, .4], mean 0.3
MASK = torch.ones(1, 2)
ADV = torch.ones(1, 2)


def test_terms_add_up_with_the_scale_on_the_task_term():
    # scale 0.5 on the task term (the release scales the advantages):
    # task 0.5 * -1 = -0.5; entropy -0.1 * 1.5 = -0.15; kl 1.0 * 0.3 = 0.3; loss -0.35
    t = actor_terms(objective(), LOGP, ENT, MASK, None, ADV, REF, scale=0.5)
    assert float(t["task"]) == pytest.approx(-0.5)
    assert float(t["entropy"]) == pytest.approx(-0.15)
    assert float(t["kl"]) == pytest.approx(0.3)
    assert float(t["loss"]) == pytest.approx(-0.35)
    assert float(t["pg"]) == pytest.approx(-1.0) and float(t["entropy_mean"]) == pytest.approx(1.5)


def test_scale_on_the_whole_loss():
    # 0.5 * (-1 - 0.15 + 0.3) = -0.425; every component halved
    t = actor_terms(objective(scale_on="loss"), LOGP, ENT, MASK, None, ADV, REF, scale=0.5)
    assert float(t["loss"]) == pytest.approx(-0.425)
    assert [float(t[c]) for c in ("task", "entropy", "kl")] == pytest.approx([-0.5, -0.075, 0.15])


def test_kl_placement_is_decided_once():
    in_reward = objective(kl_placement="in_reward")
    assert in_reward.uses_reference and in_reward.kl_in_reward and not in_reward.kl_in_loss
    # KL in the reward leaves the loss without a KL term (no reference needed there) ...
    t = actor_terms(in_reward, LOGP, ENT, MASK, None, ADV, None)
    assert float(t["kl"]) == 0.0 and float(t["loss"]) == pytest.approx(-1.0 - 0.15)
    # ... and takes kl_coef * k1 = [.2, .4] off each reply token's reward
    rewards = torch.tensor([[0.0, 1.0]])
    assert torch.allclose(rewards_with_kl(in_reward, rewards, LOGP, REF, MASK), torch.tensor([[-0.2, 0.6]]))
    # A zero coefficient switches KL off everywhere, whatever the placement.
    off = objective(kl_coef=0.0)
    assert not off.uses_reference and not off.kl_in_loss and not off.kl_in_reward
    assert torch.equal(rewards_with_kl(objective(kl_coef=0.0, kl_placement="in_reward"), rewards, LOGP, REF, MASK),
                       rewards)
    assert float(actor_terms(off, LOGP, ENT, MASK, None, ADV, None)["kl"]) == 0.0
    with pytest.raises(ValueError, match="ref_logp"):
        actor_terms(objective(), LOGP, ENT, MASK, None, ADV, None)
    with pytest.raises(ValueError, match="kl_placement"):
        objective(kl_placement="nowhere")


def test_dr_grpo_constant_length():
    # seq-mean-token-sum with norm_len 4: row sums / 4. Rows: 2 tokens of A=1 and 3 tokens of A=-1,
    # on-policy pg per token = -A -> row sums [-2, 3] -> / 4 = [-.5, .75] -> mean .125.
    # Without the constant: mean(-2, 3) = 0.5, a scale that grows with reply length.
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    ent = torch.zeros(2, 3)
    dr = objective(agg="seq-mean-token-sum", norm_len=4.0, entropy_coef=0.0, kl_coef=0.0)
    assert float(actor_terms(dr, logp, ent, mask, None, adv, None)["pg"]) == pytest.approx(0.125)
    raw = objective(agg="seq-mean-token-sum", norm_len=None, entropy_coef=0.0, kl_coef=0.0)
    assert float(actor_terms(raw, logp, ent, mask, None, adv, None)["pg"]) == pytest.approx(0.5)


def test_on_policy_equals_explicit_old_logp():
    # With old_logp = current log-probs the ratio is 1: the surrogate is -mean(A) over tokens, and
    # passing None (on-policy shortcut) must give the same loss and the same gradient.
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    ids = torch.tensor([[1, 2, 3], [4, 0, 1]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    ent = torch.zeros(2, 3)
    obj = objective(agg="seq-mean-token-mean", kl_coef=0.0, entropy_coef=0.0)
    a = actor_terms(obj, logp, ent, mask, None, adv, None)
    b = actor_terms(obj, logp, ent, mask, logp.detach(), adv, None)
    # seq-mean-token-mean of -A * 1: rows -1 and +2 -> mean 0.5
    assert float(a["pg"]) == pytest.approx(0.5) and float(b["pg"]) == pytest.approx(0.5)
    ga = torch.autograd.grad(a["pg"], logits, retain_graph=True)[0]
    gb = torch.autograd.grad(b["pg"], logits)[0]
    assert torch.allclose(ga, gb)
    assert float(a["clipfrac"]) == 0.0 and float(a["clipfrac_lower"]) == 0.0
    # KL of the policy to itself is 0 for every estimator.
    for est in ("k1", "k2", "k3", "k3_exact"):
        t = actor_terms(objective(kl_estimator=est, entropy_coef=0.0), logp, ent, mask, None, adv, logp.detach())
        assert float(t["kl"]) == pytest.approx(0.0, abs=1e-7)
