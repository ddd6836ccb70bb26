"""Gradient decomposition: how much of an update is task signal and how much regulariser push.

The SNR view of template collapse (REFERENCE.md section 1): a group whose rollouts all score alike
contributes almost no task gradient, while the KL and entropy terms push with an input-agnostic force
of about the same size everywhere. Measuring the components separately, per band of in-group reward
spread, shows that ratio directly.

    bucket = spread_buckets(group_reward_std, n_buckets=2)          # [G] long, 0 = lowest spread
    stats = decomposition_stats({"task": g_task, "kl": g_kl, "entropy": g_ent})
"""
from __future__ import annotations

import math

import torch


def spread_buckets(group_reward_std: torch.Tensor, *, n_buckets: int) -> torch.Tensor:
    """Assign each group to a quantile bucket of its reward spread.

    Groups are ranked by spread (ties by index, so the split is deterministic) and cut into
    `n_buckets` near-equal consecutive runs: bucket b holds ranks [floor(b G / n), floor((b+1) G / n)).

    Args:
        group_reward_std: [G] float.
        n_buckets: >= 1; more buckets than groups leaves some buckets empty.

    Returns:
        [G] long bucket index per group, 0 = lowest spread.
    """
    if n_buckets < 1:
        raise ValueError(f"spread_buckets: n_buckets must be >= 1, got {n_buckets}")
    G = group_reward_std.numel()
    order = torch.sort(group_reward_std.detach().double(), stable=True).indices
    bucket = torch.empty(G, dtype=torch.long)
    bucket[order] = torch.arange(G) * n_buckets // max(G, 1)
    return bucket


def decomposition_stats(grads: dict[str, list[torch.Tensor] | None]) -> dict[str, float]:
    """Norms of the task and regulariser gradient components and their ratio.

    Args:
        grads: "task", "kl", "entropy" -> list of per-parameter gradient tensors of that component,
            already multiplied by its coefficient (the component as it enters the update), or None
            when the component is switched off (norm 0).

    Returns:
        grad_norm_task, grad_norm_kl, grad_norm_entropy; grad_norm_reg = ||g_kl + g_entropy||;
        reg_to_task_grad_ratio = grad_norm_reg / grad_norm_task (NaN when the task gradient is exactly
        0, e.g. every group has zero spread under GRPO: the ratio is then unbounded, not a number).
    """
    def norm(parts):
        return math.sqrt(sum(float((p.double() ** 2).sum()) for p in parts)) if parts else 0.0

    task, kl, ent = grads.get("task"), grads.get("kl"), grads.get("entropy")
    if kl and ent:
        reg = [a + b for a, b in zip(kl, ent)]
    else:
        reg = kl or ent
    out = {"grad_norm_task": norm(task), "grad_norm_kl": norm(kl), "grad_norm_entropy": norm(ent),
           "grad_norm_reg": norm(reg)}
    out["reg_to_task_grad_ratio"] = (out["grad_norm_reg"] / out["grad_norm_task"]
                                     if out["grad_norm_task"] > 0 else float("nan"))
    return out
