"""Advantage estimators: token-level GAE over multi-turn sequences, group-relative (GRPO / Dr.GRPO).

Batch layout: B trajectories, each one token sequence of length T holding the whole conversation.
`response_mask [B, T]` marks the model's own tokens; prompt and environment tokens are 0. The reward of
a turn sits on the last response token of that turn (`token_rewards [B, T]`).

Usage:
    adv, ret = gae_advantages(token_rewards, values, response_mask, gamma=1.0, lam=1.0)
    seq_adv = group_advantages(seq_reward, group_ids, norm_by_std=True)   # GRPO
    token_adv = broadcast_to_tokens(seq_adv, response_mask)
    adv = whiten(adv, response_mask)                  # batch whitening (veRL's masked_whiten)
"""
from __future__ import annotations

import torch


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation run over response tokens only.

    Args:
        token_rewards: [B, T] float, reward on the last response token of each turn. Entries outside
            `response_mask` are ignored (no action of the model produced them).
        values: [B, T] float, critic value per token.
        response_mask: [B, T] bool or {0, 1} float.
        gamma: discount per response token.
        lam: GAE lambda.

    Returns:
        (advantages, returns), both [B, T], zero outside the mask. For a response token t the "next"
        value is the value at the next response token of the same row (environment and prompt tokens
        in between are skipped, so they neither discount nor bootstrap), and 0 after the last one.
        gamma = lam = 1 gives return-to-go minus value.
    """
    mask = response_mask.bool()
    rewards = token_rewards.detach().to(values.dtype)
    values = values.detach()
    B, T = values.shape
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(B)
    next_gae = values.new_zeros(B)
    # Backward sweep; rows carry their running state untouched across non-response tokens.
    for t in range(T - 1, -1, -1):
        is_resp = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * next_gae
        advantages[:, t] = torch.where(is_resp, gae_t, torch.zeros_like(gae_t))
        next_gae = torch.where(is_resp, gae_t, next_gae)
        next_value = torch.where(is_resp, values[:, t], next_value)
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def group_advantages(
    seq_reward: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    norm_by_std: bool,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantage: reward minus its group's mean, optionally over (group std + eps).

    Args:
        seq_reward: [B] float, one scalar reward per trajectory.
        group_ids: [B] long, trajectories sharing an id were sampled from the same prompt; ids need not
            be contiguous or sorted.
        norm_by_std: True divides by (group std + eps) as in GRPO; False leaves the centred reward
            unscaled as in Dr.GRPO.
        std_ddof: delta degrees of freedom of the group std (1 = sample std).
        eps: added to the group std before dividing.

    Returns:
        seq_adv: [B] float. A group of size 1 or with all rewards equal gets exactly 0 (it carries no
        preference between its samples), never NaN.
    """
    seq_reward = seq_reward.detach()
    unique_ids, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = unique_ids.numel()
    group_count = torch.bincount(inverse, minlength=n_groups).to(seq_reward.dtype)
    group_sum = seq_reward.new_zeros(n_groups).index_add_(0, inverse, seq_reward)
    group_reward_mean = group_sum / group_count
    centred = seq_reward - group_reward_mean[inverse]

    # Exact equality test, so float round-off in the mean cannot leak a tiny non-zero advantage.
    group_max = seq_reward.new_full((n_groups,), -float("inf")).scatter_reduce(0, inverse, seq_reward, "amax")
    group_min = seq_reward.new_full((n_groups,), float("inf")).scatter_reduce(0, inverse, seq_reward, "amin")
    no_spread = (group_max == group_min)[inverse]

    if norm_by_std:
        group_sq = seq_reward.new_zeros(n_groups).index_add_(0, inverse, centred**2)
        dof = (group_count - std_ddof).clamp_min(1.0)
        group_reward_std = (group_sq / dof).sqrt()
        centred = centred / (group_reward_std[inverse] + eps)
    return torch.where(no_spread, torch.zeros_like(centred), centred)


def broadcast_to_tokens(seq_adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Copy each trajectory's advantage onto its response tokens.

    Args:
        seq_adv: [B] float.
        response_mask: [B, T] bool or {0, 1} float.

    Returns:
        [B, T] float, seq_adv[b] on response tokens, 0 elsewhere.
    """
    return seq_adv[:, None] * response_mask.to(seq_adv.dtype)


def whiten(x: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Shift and scale `x` to mean 0 and variance 1 over the masked entries (veRL's `masked_whiten`).

    Args:
        x: [B, T] float; mask: [B, T] bool or {0, 1} float.
        unbiased: variance with Bessel's correction n / (n - 1), as veRL; False = population variance.
        eps: added to the variance before the square root.

    Returns:
        [B, T] float, (x - mean) / sqrt(var + eps) on masked entries, 0 elsewhere. With a single
        masked entry the variance is taken as 0 (veRL raises there), so that entry becomes 0.
    """
    w = mask.to(x.dtype)
    n = w.sum()
    mean = (x * w).sum() / n.clamp(min=1)
    var = (((x - mean) * w) ** 2).sum() / n.clamp(min=1)
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * w
