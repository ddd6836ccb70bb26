"""The training loop: ``run(cfg, sink) -> result``. One file, read top to bottom.

Each step: rollout -> filter (SNR hook) -> advantage -> loss/step -> metrics -> eval -> checkpoint.
Everything random is derived from ``(train.seed, step)``, so a resumed run replays exactly the
steps an uninterrupted one would, given the model and optimizer state in the checkpoint.

    from ragen2_core.config import load_config
    from ragen2_core.tracking import StdoutSink
    result = run(load_config("sweeps/base/frozenlake_tiny.yaml"), StdoutSink(total_steps=100))
"""
from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from ragen2_core.algo.advantages import broadcast_to_tokens, gae_advantages, group_advantages
from ragen2_core.algo.filter import group_reward_stats, loss_scale_factor, select_groups
from ragen2_core.algo.losses import (aggregate, entropy_from_logits, kl_penalty, logp_from_logits,
                                     policy_loss, value_loss)
from ragen2_core.config import config_hash, dump_yaml, flatten
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.load import load_policy
from ragen2_core.rollout.engine import SamplingParams, rollout
from ragen2_core.rollout.evaluate import batch_stats, evaluate, val_seeds
from ragen2_core.train import checkpoint
from ragen2_core.train.critic import build_critic
from ragen2_core.train.engine import FrozenModel, TrainEngine, init_distributed
from ragen2_core.tracking import run_tags, git_sha
from ragen2_core.types import RolloutBatch


def step_rng(seed: int, step: int, stream: int, rank: int = 0) -> np.random.Generator:
    """Independent, reproducible randomness per (seed, step, purpose, data-parallel rank)."""
    return np.random.default_rng([seed, step, stream, rank])


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = mask.sum().clamp(min=1)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + 1e-8) * mask


def forward_logits(forward, ids, attn):
    """Logits predicting each next token, [B, T-1, V]; ``forward`` is a model or an engine's forward."""
    return forward(input_ids=ids, attention_mask=attn).logits[:, :-1].float()


@torch.no_grad()
def score_tokens(model, t: dict, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of each next token and the policy entropy there, [B, T-1] each (zero
    past a row's end). Rows go in length order, each chunk cut to its longest row."""
    B, T = t["input_ids"].shape
    lengths = t["attention_mask"].sum(-1)
    logp, entropy = torch.zeros(B, T - 1), torch.zeros(B, T - 1)
    for rows in torch.split(torch.argsort(lengths, stable=True), micro):
        L = int(lengths[rows].max())
        ids, attn = t["input_ids"][rows, :L], t["attention_mask"][rows, :L]
        logits = forward_logits(model, ids, attn)
        real = attn[:, 1:].float()
        logp[rows, :L - 1] = logp_from_logits(logits, ids[:, 1:]) * real
        entropy[rows, :L - 1] = entropy_from_logits(logits) * real
    return logp, entropy


def run(cfg, sink) -> dict:
    # ================================================================ setup
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed = cfg.train.seed
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    rank, world = init_distributed()  # under torchrun each rank rolls out its own groups
    out_dir = Path(cfg.train.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    algo, fcfg, rcfg = cfg.algo, cfg.filter, cfg.rollout

    model, tok, policy_path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    make_env = env_factory(cfg.env)
    reference = FrozenModel(copy.deepcopy(model)) if algo.kl_coef > 0 else None
    n_rows = rcfg.n_groups * rcfg.group_size
    micro = max(1, -(-n_rows // (algo.mini_batches * cfg.train.grad_accum)))
    engine_kw = dict(zero_stage=cfg.train.zero_stage, grad_accum=cfg.train.grad_accum,
                     micro_batch_size=micro, max_grad_norm=algo.max_grad_norm,
                     user_config=cfg.train.deepspeed_config)
    actor = TrainEngine(model, lr=algo.actor_lr, **engine_kw)
    critic = (TrainEngine(build_critic(policy_path, model), lr=algo.critic_lr, **engine_kw)
              if algo.advantage == "gae" else None)
    sampling = SamplingParams(temperature=rcfg.temperature, top_p=rcfg.top_p, top_k=rcfg.top_k,
                              max_new_tokens=rcfg.max_new_tokens,
                              max_context_tokens=rcfg.max_context_tokens)
    eval_sampling = SamplingParams(greedy=True, max_new_tokens=rcfg.max_new_tokens,
                                   max_context_tokens=rcfg.max_context_tokens)

    start_step, state = 0, {}
    if cfg.train.resume:
        found = checkpoint.latest(out_dir)
        if found is not None:
            state = checkpoint.load(found, actor, critic)
            start_step = state["step"] + 1
            print(f"[train] resumed from {found} at step {start_step}", flush=True)
    if start_step == 0:
        sink.log_params(flatten(cfg))
        sink.set_tags(run_tags(config_hash(cfg), seed, git_sha()) | {"ragen2.policy": str(policy_path)})
        sink.log_text(dump_yaml(cfg), "config.yaml")

    last_eval: dict = {}
    metrics: dict = {}
    for step in range(start_step, cfg.train.steps):
        t_step = time.perf_counter()
        # ============================================================ rollout
        rng = step_rng(seed, step, 0, rank)
        group_seeds = rng.integers(0, cfg.env.val_seed_start, rcfg.n_groups).tolist()
        env_seeds = [s for s in group_seeds for _ in range(rcfg.group_size)]
        dyn_seeds = rng.integers(0, 2**31 - 1, n_rows).tolist()
        group_ids = [g for g in range(rcfg.n_groups) for _ in range(rcfg.group_size)]
        gen = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
        t0 = time.perf_counter()
        batch = rollout(actor.module, tok, make_env, env_seeds=env_seeds, dynamics_seeds=dyn_seeds,
                        group_ids=group_ids, sampling=sampling, generator=gen)
        rollout_s = time.perf_counter() - t0
        metrics = rollout_metrics(batch, rcfg.n_groups, rcfg.group_size)
        metrics["time/rollout_s"] = rollout_s
        metrics["perf/tokens_per_s"] = sum(map(sum, batch.response_mask)) / max(rollout_s, 1e-9)

        # ============================================================ filter (SNR hook)
        group_rewards = torch.tensor(batch.episode_reward).view(rcfg.n_groups, rcfg.group_size)
        keep = select_groups(group_rewards, strategy=fcfg.strategy, value=fcfg.value, mode=fcfg.mode,
                             statistic=fcfg.statistic, include_zero=fcfg.include_zero)
        kept_rows = [b for b, g in enumerate(batch.group_ids) if keep[g]]
        kept_ratio = float(keep.float().mean())
        spread = group_reward_stats(group_rewards, statistic="std")
        metrics |= {"filter/kept_ratio": kept_ratio, "filter/kept_groups": int(keep.sum()),
                    "filter/zero_std_groups": int((spread <= 1e-8).sum()),
                    "filter/kept_group_reward_std": float(spread[keep].mean()) if keep.any() else 0.0,
                    "filter/keep_target": fcfg.value}
        t0 = time.perf_counter()
        if kept_rows:
            metrics |= update(batch.select(kept_rows), actor, critic, reference, tok, cfg, step,
                              micro, loss_scale_factor(kept_ratio, mode=fcfg.loss_scale))
        metrics["time/update_s"] = time.perf_counter() - t0

        # ============================================================ eval
        if rank == 0 and cfg.train.eval_every and ((step + 1) % cfg.train.eval_every == 0 or step + 1 == cfg.train.steps):
            t0 = time.perf_counter()
            stats, eval_batch = evaluate(actor.module, tok, make_env, seeds=val_seeds(cfg.env),
                                         sampling=eval_sampling, seed=seed)
            last_eval = {f"eval/{k}": v for k, v in stats.items()}
            metrics |= last_eval | {"time/eval_s": time.perf_counter() - t0}
            sink.log_text(sample_text(eval_batch, tok, k=3), f"samples/eval_step{step + 1:06d}.txt")
        metrics["time/step_s"] = time.perf_counter() - t_step
        sink.log_metrics(metrics, step=step + 1)

        # ============================================================ checkpoint
        if cfg.train.checkpoint_every and (step + 1) % cfg.train.checkpoint_every == 0:
            checkpoint.save(out_dir, step, actor, critic, keep=cfg.train.keep_checkpoints, rank=rank)

    # ================================================================ export
    export_dir = out_dir / "policy"
    checkpoint.export_policy(actor, tok, export_dir, rank=rank)
    sink.log_artifact(export_dir, "policy")
    result = {"steps": cfg.train.steps, "policy_dir": str(export_dir), **metrics, **last_eval}
    if rank == 0:
        (out_dir / "result.json").write_text(json.dumps(result, indent=2, default=float))
    return result


def rollout_metrics(batch: RolloutBatch, n_groups: int, group_size: int) -> dict[str, float]:
    stats = batch_stats(batch)
    spread = group_reward_stats(torch.tensor(batch.episode_reward).view(n_groups, group_size),
                                statistic="std")
    return {f"rollout/{k}": v for k, v in stats.items()} | {
        "rollout/group_reward_std": float(spread.mean()),
        "rollout/frac_zero_std_groups": float((spread <= 1e-8).float().mean()),
        "rollout/response_tokens": sum(map(sum, batch.response_mask)) / len(batch),
        "rollout/truncated": sum(batch.truncated) / len(batch),
    }


def update(batch: RolloutBatch, actor, critic, reference, tok, cfg, step: int, micro: int,
           loss_scale: float) -> dict[str, float]:
    """Advantages, then ppo_epochs x mini_batches optimizer steps over the kept rows."""
    algo = cfg.algo
    # ============================================================ advantage
    t = batch.padded(tok.pad_token_id)
    mask = t["response_mask"][:, 1:]            # next-token positions that are reply tokens
    rewards = t["token_rewards"][:, 1:]
    old_logp, old_entropy = score_tokens(actor.module, t, micro)
    kl_tokens = torch.zeros_like(old_logp)
    if reference is not None:
        ref_logp, _ = score_tokens(reference.module, t, micro)
        kl_tokens = kl_penalty(old_logp, ref_logp, estimator=algo.kl_estimator) * mask
        if algo.kl_placement == "in_reward":
            rewards = rewards - algo.kl_coef * kl_tokens
    if critic is not None:
        with torch.no_grad():
            old_values = torch.cat([critic.module(input_ids=t["input_ids"][r], attention_mask=t["attention_mask"][r]
                                                  ).logits[:, :-1, 0].float()
                                    for r in torch.split(torch.arange(len(batch)), micro)])
        advantages, returns = gae_advantages(rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam)
        advantages = masked_whiten(advantages, mask)
    else:
        seq_adv = group_advantages(rewards.sum(-1), torch.tensor(batch.group_ids),
                                   norm_by_std=algo.advantage == "grpo")
        advantages, returns, old_values = broadcast_to_tokens(seq_adv, mask), None, None

    # ============================================================ loss / step
    logs: dict[str, list[float]] = {}
    B = len(batch)
    lengths = t["attention_mask"].sum(-1)
    for epoch in range(algo.ppo_epochs):
        order = torch.from_numpy(step_rng(cfg.train.seed, step, 1 + epoch, actor.rank).permutation(B))
        for mb in torch.tensor_split(order, algo.mini_batches):
            # Micro-batches of similar lengths, each cut to its own longest row: multi-turn
            # episodes differ several-fold in length, and padding would dominate the update.
            mb = mb[torch.argsort(lengths[mb], stable=True)]
            for rows in torch.tensor_split(mb, cfg.train.grad_accum):
                # An empty micro-batch still takes part, with zero weight, so DeepSpeed's
                # accumulation boundary stays aligned with the mini-batch.
                weight = 1.0 if len(rows) else 0.0
                rows = rows if len(rows) else mb[:1]
                L = int(lengths[rows].max())
                ids, attn, m = t["input_ids"][rows, :L], t["attention_mask"][rows, :L], mask[rows, :L - 1]
                logits = forward_logits(actor.forward, ids, attn)
                logp = logp_from_logits(logits, ids[:, 1:])
                pg, pg_stats = policy_loss(logp, old_logp[rows, :L - 1], advantages[rows, :L - 1], m,
                                           clip_low=algo.clip_low, clip_high=algo.clip_high, agg=algo.loss_agg)
                loss = pg
                if algo.entropy_coef:  # actor/entropy is logged from the rollout pass either way
                    loss = loss - algo.entropy_coef * aggregate(entropy_from_logits(logits), m, mode=algo.loss_agg)
                if reference is not None and algo.kl_placement == "in_loss":
                    kl_now = kl_penalty(logp, ref_logp[rows, :L - 1], estimator=algo.kl_estimator)
                    loss = loss + algo.kl_coef * aggregate(kl_now, m, mode=algo.loss_agg)
                actor.backward(loss * loss_scale * weight)
                actor.step()
                for k, v in {"actor/pg_loss": pg, "actor/clipfrac": pg_stats["clipfrac"],
                             "actor/approx_kl": pg_stats["approx_kl"]}.items():
                    logs.setdefault(k, []).append(float(v.detach()) if torch.is_tensor(v) else float(v))
                if critic is not None:
                    values = critic.forward(input_ids=ids, attention_mask=attn).logits[:, :-1, 0].float()
                    vloss, vstats = value_loss(values, old_values[rows, :L - 1], returns[rows, :L - 1], m,
                                               clip=algo.value_clip, agg=algo.loss_agg)
                    critic.backward(vloss * weight)
                    critic.step()
                    logs.setdefault("critic/value_loss", []).append(float(vloss.detach()))
                    logs.setdefault("critic/vf_clipfrac", []).append(float(vstats["vf_clipfrac"]))
            logs.setdefault("actor/grad_norm", []).append(actor.grad_norm())
    out = {k: float(np.mean(v)) for k, v in logs.items()}
    out["actor/entropy"] = float(aggregate(old_entropy, mask, mode="token-mean"))
    out["actor/kl"] = float(aggregate(kl_tokens, mask, mode="token-mean")) if reference is not None else float("nan")
    out["actor/lr"] = actor.lr()
    if critic is None:
        out |= {"critic/value_loss": float("nan"), "critic/vf_clipfrac": float("nan")}
    return out


def sample_text(batch: RolloutBatch, tok, k: int) -> str:
    parts = []
    for b in range(min(k, len(batch))):
        parts.append(f"=== seed {batch.env_seeds[b]} success {batch.success[b]} reward "
                     f"{batch.episode_reward[b]:.2f}\n{tok.decode(batch.token_ids[b])}")
    return "\n\n".join(parts)
