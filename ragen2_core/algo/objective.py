"""The actor's objective, assembled in one place and read in one screen.

    loss = s * pg  -  entropy_coef * entropy  +  kl_coef * kl          (s on the task term: the release)
    loss = s * (pg  -  entropy_coef * entropy  +  kl_coef * kl)        (scale_on = "loss")
    token_reward -> token_reward - kl_coef * kl_t                       (kl_placement = "in_reward")

pg is the (dual-)clipped PPO surrogate, entropy the mean policy entropy (a bonus, hence the minus),
kl the estimator of KL(pi || pi_ref); all three are aggregated the same way (`agg`, with Dr.GRPO's
constant `norm_len` for seq-mean-token-sum). s is the filter's loss scale for this step: the release
multiplies the advantages by the kept ratio, which scales exactly the task term (the surrogate is
linear in A for A's of one sign), so the regularisers keep their weight; "loss" scales everything.

Where the KL goes is decided here once: a reference model exists iff `uses_reference`, KL enters the
rewards iff `kl_in_reward` (before advantages), the loss iff `kl_in_loss`. The update and the gradient
probe both take their terms from `actor_terms`, so they cannot disagree about the objective.

    obj = Objective(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, agg="token-mean", norm_len=None,
                    entropy_coef=0.001, kl_coef=0.0, kl_estimator="k3", kl_placement="in_loss")
    terms = actor_terms(obj, logp, entropy_tok, mask, old_logp, advantages, ref_logp, scale=1.0)
    terms["loss"].backward()
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .losses import aggregate, kl_penalty, policy_loss

KL_PLACEMENTS = ("in_loss", "in_reward")
SCALE_ON = ("task", "loss")


@dataclass(frozen=True)
class Objective:
    """The coefficients and choices of the actor loss (plain numbers and names, no run config)."""
    clip_low: float
    clip_high: float
    clip_ratio_c: float | None
    agg: str
    norm_len: float | None
    entropy_coef: float
    kl_coef: float
    kl_estimator: str
    kl_placement: str
    scale_on: str = "task"

    def __post_init__(self):
        if self.kl_placement not in KL_PLACEMENTS:
            raise ValueError(f"Objective: kl_placement {self.kl_placement!r} is not one of {KL_PLACEMENTS}")
        if self.scale_on not in SCALE_ON:
            raise ValueError(f"Objective: scale_on {self.scale_on!r} is not one of {SCALE_ON}")

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def kl_in_loss(self) -> bool:
        return self.uses_reference and self.kl_placement == "in_loss"

    @property
    def kl_in_reward(self) -> bool:
        return self.uses_reference and self.kl_placement == "in_reward"


def rewards_with_kl(obj: Objective, token_rewards: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """token_rewards - kl_coef * kl_t on reply tokens when KL is placed in the reward, else unchanged.

    All [B, T]; `logp` are the behaviour log-probs (the rewards are fixed before the update)."""
    if not obj.kl_in_reward:
        return token_rewards
    return token_rewards - obj.kl_coef * kl_penalty(logp, ref_logp, estimator=obj.kl_estimator) * mask


def actor_terms(obj: Objective, logp: torch.Tensor, entropy_tok: torch.Tensor, mask: torch.Tensor,
                old_logp: torch.Tensor | None, advantages: torch.Tensor, ref_logp: torch.Tensor | None,
                *, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The loss and its terms from one forward pass.

    Args:
        logp: [B, T] current log-probs of the taken tokens (carries the gradient).
        entropy_tok: [B, T] policy entropy per position (carries the gradient).
        mask: [B, T] reply tokens; advantages [B, T].
        old_logp: [B, T] behaviour log-probs, or None when the update is on-policy (one epoch, one
            mini-batch): the ratio is then exactly 1, so the current log-probs (detached) stand in
            and a separate scoring pass is saved.
        ref_logp: [B, T] reference log-probs; needed when `obj.kl_in_loss`.
        scale: the filter's loss scale this step (`loss_scale_factor`), applied per `obj.scale_on`.

    Returns:
        loss; the weighted components `task`, `entropy`, `kl` whose sum is the loss (each 0 when
        switched off: the gradient probe differentiates them one by one); the unweighted `pg`,
        `entropy_mean`; stats `clipfrac`, `clipfrac_lower`, `approx_kl` (detached).
    """
    if obj.kl_in_loss and ref_logp is None:
        raise ValueError("actor_terms: the objective puts KL in the loss but ref_logp is None")
    behaviour = logp.detach() if old_logp is None else old_logp
    pg, stats = policy_loss(logp, behaviour, advantages, mask, clip_low=obj.clip_low, clip_high=obj.clip_high,
                            clip_ratio_c=obj.clip_ratio_c, agg=obj.agg, norm_len=obj.norm_len)
    entropy = aggregate(entropy_tok, mask, mode=obj.agg, norm_len=obj.norm_len)
    zero = logp.new_zeros(())
    kl = (aggregate(kl_penalty(logp, ref_logp, estimator=obj.kl_estimator), mask, mode=obj.agg, norm_len=obj.norm_len)
          if obj.kl_in_loss else zero)
    task_scale, all_scale = (scale, 1.0) if obj.scale_on == "task" else (1.0, scale)
    components = {"task": all_scale * task_scale * pg,
                  "entropy": -all_scale * obj.entropy_coef * entropy if obj.entropy_coef else zero,
                  "kl": all_scale * obj.kl_coef * kl if obj.kl_in_loss else zero}
    return {"loss": components["task"] + components["entropy"] + components["kl"], **components,
            "pg": pg, "entropy_mean": entropy, **stats}
