"""SNR-aware rollout filter: keep the prompt groups whose in-group reward spread is largest.

A batch holds G groups (one prompt / env seed each) of S rollouts. A group whose rollouts all earn about
the same reward has a weak task gradient, while the KL / entropy regularisers push with the same force
everywhere, so such a group feeds mostly regulariser noise into the update. Ranking groups by reward
spread and dropping the low ones raises the signal-to-noise ratio of the step.

Usage:
    group_keep = select_groups(group_rewards, strategy="top_p", value=0.9, mode="softmax",
                               statistic="std", include_zero=True)       # [G] bool
    scale = loss_scale_factor(group_keep.float().mean().item(), mode="linear")
"""
from __future__ import annotations

import math

import torch

STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p")
TOP_P_MODES = ("linear", "softmax")
STATISTICS = ("std", "var")
SCALE_MODES = ("none", "linear", "sqrt")
# Scores at or below this count as zero spread; also the slack of the min_p comparison.
ZERO_SCORE_TOL = 1e-8


def group_reward_stats(group_rewards: torch.Tensor, *, statistic: str) -> torch.Tensor:
    """In-group reward spread.

    Args:
        group_rewards: [G, S] float, one row per group.
        statistic: "std" or "var", both with ddof = 1. (The reference release ranks by std although its
            option is called "reward_variance"; hence the explicit choice.)

    Returns:
        [G] float score; 0 for groups of size S = 1 (no spread can be measured).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"group_reward_stats: unknown statistic {statistic!r}; expected one of {STATISTICS}")
    G, S = group_rewards.shape
    if S < 2:
        return group_rewards.new_zeros(G)
    centred = group_rewards - group_rewards.mean(dim=1, keepdim=True)
    group_reward_var = (centred**2).sum(dim=1) / (S - 1)
    return group_reward_var if statistic == "var" else group_reward_var.sqrt()


def _n_keep(strategy: str, value: float, mode: str, ranked_scores: torch.Tensor, n_groups: int, eps: float) -> int:
    """Number of top-ranked candidates to keep (prefix length) for prefix-shaped strategies."""
    n = ranked_scores.numel()
    if strategy == "top_k":
        # Fraction of ALL groups, rounded half up (the release truncates; rounding keeps e.g.
        # value 0.25 of 6 groups at 2 rather than 1).
        k = math.floor(value * n_groups + 0.5)
    elif strategy == "top_k_abs":
        k = int(value)
    elif value >= 1.0 or float(ranked_scores.sum()) <= ZERO_SCORE_TOL:
        # top_p = 1 keeps every candidate (zero-spread ones included when include_zero), and an
        # all-zero candidate set has nothing to rank by.
        k = n
    else:
        if mode == "linear":
            cum = torch.cumsum(ranked_scores, dim=0)
            threshold = value * float(ranked_scores.sum()) - eps
        else:
            # softmax is monotone, so the score order is also the probability order.
            cum = torch.cumsum(torch.softmax(ranked_scores, dim=0), dim=0)
            threshold = value - eps
        # cum is non-decreasing: entries still below the threshold are exactly the prefix that must
        # be extended by one more group.
        k = int((cum < threshold).sum()) + 1
    # A non-empty candidate set always keeps at least its top group: an empty update is a failure
    # regime, not a filter outcome.
    return min(max(k, 1), n)


def select_groups(
    group_rewards: torch.Tensor,
    *,
    strategy: str,
    value: float,
    mode: str = "linear",
    statistic: str = "std",
    include_zero: bool = True,
    eps: float = 0.01,
) -> torch.Tensor:
    """Choose which groups enter the update.

    Args:
        group_rewards: [G, S] float trajectory rewards, one row per group.
        strategy:
            "top_p": rank by score (descending, ties by lower index); keep the shortest prefix whose
                cumulative score reaches value * total score - eps (mode "linear"), or whose cumulative
                softmax(score) probability reaches value - eps (mode "softmax"). value >= 1 keeps every
                candidate; an all-zero candidate set is kept whole.
            "top_k": keep round_half_up(value * G) groups (G counts all groups, not only candidates).
            "top_k_abs": keep int(value) groups.
            "min_p": keep groups with score >= value * max score.
            Prefix strategies keep between 1 and the number of candidates.
        value: the strategy's parameter (>= 0).
        mode: "linear" or "softmax"; used by top_p only.
        statistic: "std" or "var" (ddof = 1), see `group_reward_stats`.
        include_zero: False removes zero-spread groups (score <= 1e-8) before selection, so they are
            never kept; True lets them compete (top_p = 1.0 then keeps everything: the "nofilter" arm).
        eps: absolute tolerance of the top_p threshold.

    Returns:
        [G] bool, True for kept groups, in the original group order.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"select_groups: unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    if mode not in TOP_P_MODES:
        raise ValueError(f"select_groups: unknown mode {mode!r}; expected one of {TOP_P_MODES}")
    if value < 0:
        raise ValueError(f"select_groups: value must be >= 0, got {value}")
    # float64 so cumulative sums compare cleanly against the threshold.
    group_score = group_reward_stats(group_rewards, statistic=statistic).detach().double()
    n_groups = group_score.numel()
    group_keep = torch.zeros(n_groups, dtype=torch.bool, device=group_rewards.device)

    candidates = torch.arange(n_groups, device=group_rewards.device)
    if not include_zero:
        candidates = candidates[group_score > ZERO_SCORE_TOL]
    if candidates.numel() == 0:
        return group_keep

    candidate_score = group_score[candidates]
    if strategy == "min_p":
        threshold = value * float(candidate_score.max())
        group_keep[candidates[candidate_score >= threshold - ZERO_SCORE_TOL]] = True
        return group_keep

    order = torch.sort(candidate_score, descending=True, stable=True).indices
    k = _n_keep(strategy, value, mode, candidate_score[order], n_groups, eps)
    group_keep[candidates[order[:k]]] = True
    return group_keep


def loss_scale_factor(kept_ratio: float, *, mode: str) -> float:
    """Multiplier for the loss after filtering.

    The loss is averaged over the kept tokens only, so dropping groups leaves the per-token gradient
    scale unchanged while each step now rests on fewer samples: the effective learning rate per
    sample rises silently. "linear" multiplies by the kept fraction (as if dropped groups contributed
    zero), "sqrt" by its square root (a middle ground matching how noise of a mean scales), "none" by 1.

    Args:
        kept_ratio: kept groups / all groups, in [0, 1].
        mode: "none", "linear" or "sqrt".
    """
    if mode not in SCALE_MODES:
        raise ValueError(f"loss_scale_factor: unknown mode {mode!r}; expected one of {SCALE_MODES}")
    if not 0.0 <= kept_ratio <= 1.0:
        raise ValueError(f"loss_scale_factor: kept_ratio must be in [0, 1], got {kept_ratio}")
    if mode == "none":
        return 1.0
    if mode == "linear":
        return float(kept_ratio)
    return math.sqrt(kept_ratio)


def soft_group_weights(group_rewards: torch.Tensor, *, statistic: str = "std") -> torch.Tensor:
    """Soft alternative to dropping groups: weight each group's advantages by its spread.

    weight_g = score_g / max_h score_h, in [0, 1] (the highest-spread group keeps full weight, a
    zero-spread group gets 0). When every group has zero spread there is nothing to rank by and all
    weights are 1.

    Args:
        group_rewards: [G, S] float. statistic: "std" or "var" (ddof 1).

    Returns:
        [G] float weights.
    """
    score = group_reward_stats(group_rewards, statistic=statistic).detach().double()
    top = float(score.max()) if score.numel() else 0.0
    if top <= ZERO_SCORE_TOL:
        return torch.ones_like(score, dtype=group_rewards.dtype)
    return (score / top).to(group_rewards.dtype)
