"""A step's descriptive metrics: `rollout/*` of the sampled batch, `cost/*` of the step (with the
running sums kept in the run's loop state), and sample episodes as text for the tracking store.

    metrics = rollout_metrics(batch, group_rewards, rollout_tokens, template)
"""
from __future__ import annotations

import torch

from ragen2_core.algo.filter import group_reward_stats, zero_spread
from ragen2_core.rollout.evaluate import batch_stats
from ragen2_core.train.state import RunContext
from ragen2_core.batches import RolloutBatch


def rollout_metrics(batch: RolloutBatch, group_rewards: torch.Tensor, rollout_tokens: int, env) -> dict[str, float]:
    """`rollout/*` of the batch; `group_rewards` [G, S], `rollout_tokens` all reply tokens, `env` one
    instance of the env (its input-independent reasoning sentence, its own batch metrics)."""
    stats = batch_stats(batch, env.template_think)
    return {f"rollout/{k}": v for k, v in stats.items()} | {
        "rollout/group_reward_std": float(group_reward_stats(group_rewards, statistic="std").mean()),
        "rollout/frac_zero_std_groups": float(zero_spread(group_rewards).double().mean()),
        "rollout/response_tokens": rollout_tokens / len(batch),
        "rollout/truncated": sum(batch.truncated) / len(batch),
    } | {f"rollout/{k}": v for k, v in env.batch_metrics([i for infos in batch.step_infos for i in infos]).items()}


def cost_metrics(ctx: RunContext, batch: RolloutBatch, kept_rows: list[int], metrics: dict) -> dict:
    """`cost/*`: tokens rolled out and kept, wall time per update, running sums (in the loop state)."""
    rollout_tokens = metrics["cost/rollout_tokens"]
    kept_tokens = sum(sum(batch.response_mask[b]) for b in kept_rows)
    wall_s = metrics["time/rollout_s"] + metrics["time/update_s"]
    ctx.loop["cum_rollout_tokens"] += rollout_tokens
    ctx.loop["cum_wall_s"] += wall_s
    return {"cost/rollout_tokens": rollout_tokens, "cost/kept_tokens": kept_tokens,
            "cost/tokens_per_kept_sample": rollout_tokens / len(kept_rows) if kept_rows else float("nan"),
            "cost/wasted_rollout_frac": 1.0 - kept_tokens / max(rollout_tokens, 1),
            "cost/wall_s_per_update": wall_s,
            "cost/cum_rollout_tokens": ctx.loop["cum_rollout_tokens"], "cost/cum_wall_s": ctx.loop["cum_wall_s"]}


def sample_text(batch: RolloutBatch, tok, k: int) -> str:
    parts = []
    for b in range(min(k, len(batch))):
        parts.append(f"=== seed {batch.env_seeds[b]} success {batch.success[b]} reward "
                     f"{batch.episode_reward[b]:.2f}\n{tok.decode(batch.token_ids[b])}")
    return "\n\n".join(parts)
