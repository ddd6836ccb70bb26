"""SNR-aware rollout filter: keep the prompt groups whose in-group reward spread is largest.

A batch holds G groups (one prompt / env seed each) of S rollouts. A group whose rollouts all earn about
the same reward has a weak task gradient, while the KL / entropy regularisers push with the same force
everywhere, so such a group feeds mostly regulariser noise into the update. Ranking groups by reward
spread and dropping the low ones raises the signal-to-noise ratio of the step.

Selection follows the RAGEN-2 release (`ragen/trainer/rollout_filter.py`) rule for rule, including
that linear top-p may keep nothing; where ragen2 differs on purpose (zero spread decided exactly) the
docstrings say so and docs/fidelity.md lists it.

Usage:
    group_keep = select_groups(group_rewards, strategy="top_p", value=0.9, mode="softmax",
                               statistic="std", include_zero=True)       # [G] bool, may be all False
    scale = loss_scale_factor(group_keep.float().mean().item(), mode="linear")
    control = select_groups(group_rewards, strategy="top_p", value=0.9, mode="softmax",
                            pick="random", generator=torch.Generator().manual_seed(0))  # as many, at random
"""
from __future__ import annotations

import math

import torch

STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p")
TOP_P_MODES = ("linear", "softmax")
STATISTICS = ("std", "var")
PICKS = ("spread", "random")
SCALE_MODES = ("none", "linear", "sqrt")
# Slack of the min_p comparison, as in the release.
MIN_P_TOL = 1e-10


def zero_spread(group_rewards: torch.Tensor) -> torch.Tensor:
    """[G, S] -> [G] bool: every reward of the group is exactly equal (always true for S = 1).

    Decided by max == min rather than by a tolerance on the std: float32 rewards such as [0.9] * 8 or
    [10.7] * 8 have a computed std of 6e-8 or 1e-6, above any sensible tolerance, and would otherwise
    pass as groups with spread."""
    return group_rewards.amax(dim=1) == group_rewards.amin(dim=1)


def group_reward_stats(group_rewards: torch.Tensor, *, statistic: str) -> torch.Tensor:
    """In-group reward spread.

    Args:
        group_rewards: [G, S] float, one row per group.
        statistic: "std" or "var", both with ddof = 1. (The reference release ranks by std although its
            option is called "reward_variance"; hence the explicit choice.)

    Returns:
        [G] float64 score; exactly 0 for zero-spread groups (`zero_spread`), including groups of size
        S = 1 (no spread can be measured; the release's ddof-1 std would be NaN there).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"group_reward_stats: unknown statistic {statistic!r}; expected one of {STATISTICS}")
    G, S = group_rewards.shape
    r = group_rewards.detach().double()
    if S < 2:
        return r.new_zeros(G)
    centred = r - r.mean(dim=1, keepdim=True)
    group_reward_var = (centred**2).sum(dim=1) / (S - 1)
    score = group_reward_var if statistic == "var" else group_reward_var.sqrt()
    return torch.where(zero_spread(r), torch.zeros_like(score), score)


def _n_keep(strategy: str, value: float, mode: str, ranked_scores: torch.Tensor, n_groups: int, eps: float) -> int:
    """Number of top-ranked candidates to keep (prefix length) for prefix-shaped strategies; 0 is possible
    for linear top_p only."""
    n = ranked_scores.numel()
    if strategy in ("top_k", "top_k_abs"):
        # The release truncates: int(value * G), G counting ALL groups, then at least 1.
        k = int(value * n_groups) if strategy == "top_k" else int(value)
        return min(max(k, 1), n)
    if value >= 1.0:
        return n  # top_p = 1 keeps every candidate (zero-spread ones too when include_zero)
    if mode == "linear":
        # Shortest prefix whose cumulative score reaches value * total - eps. When that threshold is
        # <= 0 (e.g. every group has zero spread) the empty prefix already reaches it: nothing is kept,
        # which is what the release's "consecutive empty filters" stop counts. Zero scores never
        # extend a prefix, since the positive ones alone sum to the total.
        cum = torch.cumsum(ranked_scores, dim=0)
        threshold = value * float(ranked_scores.sum()) - eps
        if threshold <= 0:
            return 0
    else:
        # Nucleus over softmax(score): shortest prefix whose probability mass reaches value, no eps
        # (always >= 1 group). softmax is monotone, so score order is probability order.
        cum = torch.cumsum(torch.softmax(ranked_scores, dim=0), dim=0)
        threshold = value
    # cum is non-decreasing: the entries still below the threshold, plus one, form the prefix.
    return min(int((cum < threshold).sum()) + 1, n)


def select_groups(
    group_rewards: torch.Tensor,
    *,
    strategy: str,
    value: float,
    mode: str = "linear",
    statistic: str = "std",
    include_zero: bool = True,
    eps: float = 0.01,
    pick: str = "spread",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Choose which groups enter the update.

    Args:
        group_rewards: [G, S] float trajectory rewards, one row per group.
        strategy:
            "top_p": rank by score (descending, ties by lower index); value >= 1 keeps every candidate.
                mode "linear": the shortest prefix whose cumulative score reaches value * total - eps;
                nothing when that threshold is <= 0. mode "softmax": the shortest prefix whose
                cumulative softmax(score) probability reaches value (no eps; at least one group).
            "top_k": keep int(value * G) groups (truncated; G counts all groups), at least 1.
            "top_k_abs": keep int(value) groups, at least 1.
            "min_p": keep groups with score >= value * max score - 1e-10.
        value: the strategy's parameter (>= 0).
        mode: "linear" or "softmax"; used by top_p only.
        statistic: "std" or "var" (ddof = 1), see `group_reward_stats`.
        include_zero: False removes zero-spread groups (`zero_spread`: all rewards equal) before
            selection, so they are never kept; True lets them compete (top_p = 1.0 then keeps
            everything: the "nofilter" arm).
        eps: absolute tolerance of the linear top_p threshold.
        pick: "spread" keeps the candidates with the largest scores (the filter); "random" keeps as
            many as "spread" would, drawn uniformly from the same candidates with ``generator``: the
            control that separates what selection does from what updating on fewer groups does.
        generator: the random draw's source (pick "random" only); pass a seeded one to reproduce it.

    Returns:
        [G] bool, True for kept groups, in the original group order; all False when no group is kept.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"select_groups: unknown strategy {strategy!r}; expected one of {STRATEGIES}")
    if mode not in TOP_P_MODES:
        raise ValueError(f"select_groups: unknown mode {mode!r}; expected one of {TOP_P_MODES}")
    if pick not in PICKS:
        raise ValueError(f"select_groups: unknown pick {pick!r}; expected one of {PICKS}")
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"select_groups: value must be >= 0, got {value}")
    # float64 so cumulative sums compare cleanly against the threshold.
    group_score = group_reward_stats(group_rewards, statistic=statistic)
    n_groups = group_score.numel()
    group_keep = torch.zeros(n_groups, dtype=torch.bool, device=group_rewards.device)

    candidates = torch.arange(n_groups, device=group_rewards.device)
    if not include_zero:
        candidates = candidates[group_score > 0]
    if candidates.numel() == 0:
        return group_keep

    candidate_score = group_score[candidates]
    order = torch.sort(candidate_score, descending=True, stable=True).indices
    if strategy == "min_p":
        # The scores at or above the threshold are a prefix of the descending order, ties included.
        k = int((candidate_score >= value * float(candidate_score.max()) - MIN_P_TOL).sum())
    else:
        k = _n_keep(strategy, value, mode, candidate_score[order], n_groups, eps)
    if pick == "random":
        order = torch.randperm(candidates.numel(), generator=generator).to(candidates.device)
    group_keep[candidates[order[:k]]] = True
    return group_keep


def loss_scale_factor(kept_ratio: float, *, mode: str) -> float:
    """Multiplier for the task term after filtering (or the whole loss: the objective decides where).

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
    weights are 1. (The release divides by max + 1e-6 and so gives all-zero weights there.)

    Args:
        group_rewards: [G, S] float. statistic: "std" or "var" (ddof 1).

    Returns:
        [G] float weights.
    """
    score = group_reward_stats(group_rewards, statistic=statistic)
    top = float(score.max()) if score.numel() else 0.0
    if top == 0.0:
        return torch.ones_like(score, dtype=group_rewards.dtype)
    return (score / top).to(group_rewards.dtype)
