"""The training loop: ``run(cfg, sink) -> result``. One file, read top to bottom.

Each step: rollout -> diagnostics (MI proxy) -> filter (SNR hook) -> gradient probe -> advantage ->
loss/step -> metrics -> eval -> stops -> checkpoint. Everything random is derived from
``(train.seed, step)``, so a resumed run replays exactly the steps an uninterrupted one would, given
the model, optimizer and loop state in the checkpoint.

    from ragen2_core.config import load_config
    from ragen2_core.tracking import StdoutSink
    result = run(load_config("sweeps/base/frozenlake_tiny.yaml"), StdoutSink(total_steps=100))
    result["stop_reason"]     # "completed", or which early stop ended the run
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch

from ragen2_core.algo.advantages import broadcast_to_tokens, gae_advantages, group_advantages
from ragen2_core.algo.filter import group_reward_stats, loss_scale_factor, select_groups, soft_group_weights
from ragen2_core.algo.losses import actor_loss_terms, aggregate, kl_penalty, logp_entropy, value_loss
from ragen2_core.algo.schedules import keep_value
from ragen2_core.config import config_hash, dump_yaml, flatten
from ragen2_core.envs.code import sandbox_metrics
from ragen2_core.envs.registry import env_factory
from ragen2_core.metrics.collapse import collapse_metrics, ema_update
from ragen2_core.policy.load import load_policy
from ragen2_core.rollout.cross_score import score_batch
from ragen2_core.rollout.dump import dump_rollouts
from ragen2_core.rollout.engine import SamplingParams, rollout
from ragen2_core.rollout.evaluate import batch_stats, evaluate, val_seeds
from ragen2_core.train import checkpoint
from ragen2_core.train.critic import build_critic
from ragen2_core.train.engine import TrainEngine, init_distributed, reference_policy
from ragen2_core.train.grad_probe import probe_batch
from ragen2_core.train.shared_prefix import forward_window, micro_batch_order, unwindow, window
from ragen2_core.train.stops import StopMonitor
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


@torch.no_grad()
def score_tokens(model, t: dict, micro: int, *, prefix_len: torch.Tensor | None = None,
                 groups: torch.Tensor | None = None, logit_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of each next token and the policy entropy there, [B, T-1] each (zero
    past a row's end, and before the last prompt token when ``prefix_len`` shares prompts). Rows go
    in length order (group by group when sharing), each chunk cut to its longest row."""
    B, T = t["input_ids"].shape
    lengths = t["attention_mask"].sum(-1)
    device = t["input_ids"].device
    logp, entropy = torch.zeros(B, T - 1, device=device), torch.zeros(B, T - 1, device=device)
    for rows in torch.split(micro_batch_order(lengths, groups if prefix_len is not None else None), micro):
        L = int(lengths[rows].max())
        ids, attn = t["input_ids"][rows, :L], t["attention_mask"][rows, :L]
        logits, start = forward_window(model, ids, attn, prefix_len=None if prefix_len is None else prefix_len[rows],
                                       logit_chunk=logit_chunk)
        w = lambda x: window(x, start, logits.shape[1])  # noqa: E731
        real = w(attn[:, 1:].float())
        lp, ent = logp_entropy(logits, w(ids[:, 1:]))
        logp[rows, :L - 1] = unwindow(lp * real, start, L - 1)
        entropy[rows, :L - 1] = unwindow(ent * real, start, L - 1)
    return logp, entropy


def agree(reason: str | None, world: int) -> str | None:
    """Rank 0's stop decision on every rank (only rank 0 evaluates), so all ranks leave together."""
    if world == 1:
        return reason
    box = [reason]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def run(cfg, sink) -> dict:
    # ================================================================ setup
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed = cfg.train.seed
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    rank, world = init_distributed()  # under torchrun each rank rolls out its own groups
    out_dir = Path(cfg.train.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    algo, fcfg, rcfg, ccfg = cfg.algo, cfg.filter, cfg.rollout, cfg.collapse

    model, tok, policy_path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    make_env = env_factory(cfg.env)
    template = make_env().template_think
    reference = reference_policy(model) if algo.kl_coef > 0 else None
    n_rows = rcfg.n_groups * rcfg.group_size
    micro = max(1, -(-n_rows // (algo.mini_batches * cfg.train.grad_accum)))
    engine_kw = dict(zero_stage=cfg.train.zero_stage, grad_accum=cfg.train.grad_accum,
                     micro_batch_size=micro, max_grad_norm=algo.max_grad_norm,
                     user_config=cfg.train.deepspeed_config,
                     bf16=cfg.policy.dtype == "bfloat16")  # fp32 master weights under a bf16 model
    actor = TrainEngine(model, lr=algo.actor_lr, **engine_kw)
    critic = (TrainEngine(build_critic(policy_path, model), lr=algo.critic_lr, **engine_kw)
              if algo.advantage == "gae" else None)
    sampling = SamplingParams(temperature=rcfg.temperature, top_p=rcfg.top_p, top_k=rcfg.top_k,
                              max_new_tokens=rcfg.max_new_tokens,
                              max_context_tokens=rcfg.max_context_tokens)
    eval_sampling = sampling if not cfg.train.eval_greedy else SamplingParams(
        greedy=True, max_new_tokens=rcfg.max_new_tokens, max_context_tokens=rcfg.max_context_tokens)
    sched = fcfg.schedule
    keep_start = fcfg.value if sched.start is None else sched.start
    monitor = StopMonitor(cfg.stops)
    # Running state that must survive a resume: the MI z-score EMA and the cost counters.
    loop = {"mi_zscore_ema": None, "cum_rollout_tokens": 0, "cum_wall_s": 0.0}

    start_step = 0
    if cfg.train.resume:
        found = checkpoint.latest(out_dir)
        if found is not None:
            state = checkpoint.load(found, actor, critic)
            start_step = state["step"] + 1
            loop |= state.get("loop", {})
            monitor.load_state_dict(state.get("stops", {}))
            print(f"[train] resumed from {found} at step {start_step}", flush=True)
    if start_step == 0:
        sink.log_params(flatten(cfg))
        sink.set_tags(run_tags(config_hash(cfg), seed, git_sha()) | {"ragen2.policy": str(policy_path)})
        sink.log_text(dump_yaml(cfg), "config.yaml")

    last_eval: dict = {}
    metrics: dict = {}
    stop_reason = "completed"
    step = start_step - 1
    for step in range(start_step, cfg.train.steps):
        t_step = time.perf_counter()
        reason = None  # set by an early stop
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
        group_rewards = torch.tensor(batch.episode_reward).view(rcfg.n_groups, rcfg.group_size)
        spread = group_reward_stats(group_rewards, statistic="std")   # [G] in-group reward std
        rollout_tokens = sum(map(sum, batch.response_mask))
        metrics = rollout_metrics(batch, spread, rollout_tokens, template)
        metrics["time/rollout_s"] = rollout_s
        metrics["perf/tokens_per_s"] = rollout_tokens / max(rollout_s, 1e-9)

        # ============================================================ diagnostics: MI proxy
        if ccfg.every and step % ccfg.every == 0 and rank == 0:
            t0 = time.perf_counter()
            scores, lengths, rows_used = score_batch(
                actor.module, batch, n_prompts=ccfg.n_prompts, k_samples=ccfg.k_samples,
                rng=step_rng(seed, step, 2, rank), trajectory=ccfg.trajectory, token_budget=ccfg.token_budget)
            mi = collapse_metrics(scores, lengths=lengths, n_perm=ccfg.n_perm, seed=seed * 100_003 + step)
            loop["mi_zscore_ema"] = ema_update(loop["mi_zscore_ema"], mi["mi_zscore"], decay=ccfg.ema_decay)
            alert, mi_stop = monitor.after_mi(zscore_ema=loop["mi_zscore_ema"])
            metrics |= {f"collapse/{k}": v for k, v in mi.items()} | {
                "collapse/mi_zscore_ema": loop["mi_zscore_ema"], "collapse/alert": float(alert),
                "collapse/n_prompts": scores.shape[0], "collapse/k_samples": scores.shape[1]}
            if alert:
                print(f"[train] template-collapse alert at step {step + 1}: MI z-score EMA "
                      f"{loop['mi_zscore_ema']:.2f} < {cfg.stops.mi_alert_zscore}", flush=True)
            reason = mi_stop
            if ccfg.dump_rollouts:
                dump_rollouts(batch.select(rows_used), tok, out_dir / "rollouts.jsonl", step=step + 1)
            metrics["time/collapse_s"] = time.perf_counter() - t0

        # ============================================================ filter (SNR hook)
        t0 = time.perf_counter()
        keep_target = (fcfg.value if sched.kind == "const" else
                       keep_value(step, total_steps=cfg.train.steps, kind=sched.kind, start=keep_start,
                                  end=sched.end, warmup_steps=min(sched.warmup_steps, cfg.train.steps)))
        keep = select_groups(group_rewards, strategy=fcfg.strategy, value=keep_target, mode=fcfg.mode,
                             statistic=fcfg.statistic, include_zero=fcfg.include_zero)
        kept_rows = [b for b, g in enumerate(batch.group_ids) if keep[g]]
        kept_ratio = float(keep.float().mean())
        metrics |= {"filter/kept_ratio": kept_ratio, "filter/kept_groups": int(keep.sum()),
                    "filter/zero_std_groups": int((spread <= 1e-8).sum()),
                    "filter/kept_group_reward_std": float(spread[keep].mean()) if keep.any() else 0.0,
                    "filter/keep_target": keep_target}
        reason = monitor.after_step(kept_groups=int(keep.sum()), group_reward_std=float(spread.mean())) or reason
        metrics["filter/empty_streak"] = monitor.empty_streak
        row_weight = torch.ones(len(batch))
        if fcfg.soft_reweight:
            row_weight = soft_group_weights(group_rewards, statistic=fcfg.statistic)[torch.tensor(batch.group_ids)]

        # ============================================================ diagnostics: gradient probe
        if cfg.grad_probe.every and step % cfg.grad_probe.every == 0:
            t0_probe = time.perf_counter()
            prep = prepare(batch, row_weight, actor, critic, reference, tok, cfg, micro, on_policy=True)
            metrics |= probe_batch(actor.module, prep, batch.group_ids, spread, cfg=cfg, micro=micro)
            metrics["time/grad_probe_s"] = time.perf_counter() - t0_probe
            t0 += metrics["time/grad_probe_s"]  # keep the probe out of the update's cost

        # ============================================================ advantage / loss / step
        if kept_rows:
            metrics |= update(batch.select(kept_rows), row_weight[kept_rows], actor, critic, reference,
                              tok, cfg, step, micro, loss_scale_factor(kept_ratio, mode=fcfg.loss_scale))
        metrics["time/update_s"] = time.perf_counter() - t0

        # ============================================================ metrics: cost
        kept_tokens = sum(sum(batch.response_mask[b]) for b in kept_rows)
        wall_s = rollout_s + metrics["time/update_s"]
        loop["cum_rollout_tokens"] += rollout_tokens
        loop["cum_wall_s"] += wall_s
        metrics |= {"cost/rollout_tokens": rollout_tokens, "cost/kept_tokens": kept_tokens,
                    "cost/tokens_per_kept_sample": rollout_tokens / len(kept_rows) if kept_rows else float("nan"),
                    "cost/wasted_rollout_frac": 1.0 - kept_tokens / max(rollout_tokens, 1),
                    "cost/wall_s_per_update": wall_s,
                    "cost/cum_rollout_tokens": loop["cum_rollout_tokens"], "cost/cum_wall_s": loop["cum_wall_s"]}

        # ============================================================ eval
        if rank == 0 and cfg.train.eval_every and ((step + 1) % cfg.train.eval_every == 0 or step + 1 == cfg.train.steps):
            t0 = time.perf_counter()
            stats, eval_batch = evaluate(actor.module, tok, make_env, seeds=val_seeds(cfg.env),
                                         sampling=eval_sampling, seed=seed)
            last_eval = {f"eval/{k}": v for k, v in stats.items()}
            metrics |= last_eval | {"time/eval_s": time.perf_counter() - t0}
            sink.log_text(sample_text(eval_batch, tok, k=3), f"samples/eval_step{step + 1:06d}.txt")
            reason = reason or monitor.after_eval(success=stats["success"])
        metrics["time/step_s"] = time.perf_counter() - t_step
        sink.log_metrics(metrics, step=step + 1)

        # ============================================================ stops
        # An early-stopped run is finished: no checkpoint is written for its last step, so a resume
        # does not train on past the point where it failed.
        reason = agree(reason, world)

        # ============================================================ checkpoint
        if cfg.train.checkpoint_every and (step + 1) % cfg.train.checkpoint_every == 0 and not reason:
            checkpoint.save(out_dir, step, actor, critic, keep=cfg.train.keep_checkpoints, rank=rank,
                            extra={"loop": loop, "stops": monitor.state_dict()})
        if reason:
            stop_reason = reason
            print(f"[train] early stop at step {step + 1}: {reason}", flush=True)
            break

    # ================================================================ export
    export_dir = out_dir / "policy"
    checkpoint.export_policy(actor, tok, export_dir, rank=rank)
    sink.log_artifact(export_dir, "policy")
    sink.set_tags({"ragen2.stop_reason": stop_reason})
    result = {"steps": cfg.train.steps, "steps_done": step + 1, "stop_reason": stop_reason,
              "policy_dir": str(export_dir), **metrics, **last_eval}
    if rank == 0:
        checkpoint.write_json_atomic(out_dir / "result.json", result)
    return result


def rollout_metrics(batch: RolloutBatch, spread: torch.Tensor, rollout_tokens: int,
                    template: str) -> dict[str, float]:
    """`rollout/*` of the batch; `spread` [G] is the in-group reward std, `rollout_tokens` all reply
    tokens, `template` the env's input-independent reasoning sentence."""
    stats = batch_stats(batch, template)
    return {f"rollout/{k}": v for k, v in stats.items()} | {
        "rollout/group_reward_std": float(spread.mean()),
        "rollout/frac_zero_std_groups": float((spread <= 1e-8).float().mean()),
        "rollout/response_tokens": rollout_tokens / len(batch),
        "rollout/truncated": sum(batch.truncated) / len(batch),
    } | {f"rollout/{k}": v for k, v in sandbox_metrics(i for infos in batch.step_infos for i in infos).items()}


def prepare(batch: RolloutBatch, row_weight: torch.Tensor, actor, critic, reference, tok, cfg, micro: int,
            *, on_policy: bool) -> dict:
    """Padded tensors, behaviour and reference log-probs, and advantages for a batch.

    With ``on_policy`` (one epoch, one mini-batch) the behaviour log-probs are not scored here: the
    update's own forward pass gives them, since the parameters do not move before its single step.
    """
    algo = cfg.algo
    device = next(actor.module.parameters()).device
    t = {k: v.to(device) for k, v in batch.padded(tok.pad_token_id).items()}
    mask = t["response_mask"][:, 1:]            # next-token positions that are reply tokens
    rewards = t["token_rewards"][:, 1:]
    share = dict(prefix_len=torch.tensor(batch.prompt_len, device=device),
                 groups=torch.tensor(batch.group_ids, device=device)
                 ) if cfg.train.shared_prefix else dict(prefix_len=None, groups=None)
    kl_in_reward = reference is not None and algo.kl_placement == "in_reward"
    old_logp = old_entropy = ref_logp = old_values = returns = None
    if not on_policy or kl_in_reward:
        old_logp, old_entropy = score_tokens(actor.module, t, micro, **share, logit_chunk=cfg.train.logit_chunk)
    if reference is not None:
        ref_logp, _ = score_tokens(reference.module, t, micro, **share, logit_chunk=cfg.train.logit_chunk)
        if kl_in_reward:
            rewards = rewards - algo.kl_coef * kl_penalty(old_logp, ref_logp, estimator=algo.kl_estimator) * mask
    if critic is not None:
        with torch.no_grad():
            old_values = torch.cat([critic.module(input_ids=t["input_ids"][r], attention_mask=t["attention_mask"][r]
                                                  ).logits[:, :-1, 0].float()
                                    for r in torch.split(torch.arange(len(batch)), micro)])
        advantages, returns = gae_advantages(rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam)
        advantages = masked_whiten(advantages, mask)
    else:
        seq_adv = group_advantages(rewards.sum(-1), torch.tensor(batch.group_ids, device=device),
                                   norm_by_std=algo.advantage == "grpo")
        advantages = broadcast_to_tokens(seq_adv, mask)
    advantages = advantages * row_weight.to(device)[:, None]   # soft reweighting (ones when off)
    if cfg.filter.zero_task_advantage:
        advantages = torch.zeros_like(advantages)
    return dict(t, mask=mask, old_logp=old_logp, old_entropy=old_entropy, ref_logp=ref_logp,
                old_values=old_values, returns=returns, advantages=advantages,
                lengths=t["attention_mask"].sum(-1), **share)


def update(batch: RolloutBatch, row_weight: torch.Tensor, actor, critic, reference, tok, cfg, step: int,
           micro: int, loss_scale: float) -> dict[str, float]:
    """Advantages, then ppo_epochs x mini_batches optimizer steps over the kept rows."""
    algo = cfg.algo
    # ============================================================ advantage
    on_policy = algo.ppo_epochs == 1 and algo.mini_batches == 1
    p = prepare(batch, row_weight, actor, critic, reference, tok, cfg, micro, on_policy=on_policy)
    mask, lengths = p["mask"], p["lengths"]
    cut = lambda x, rows, L: None if x is None else x[rows, :L - 1]  # noqa: E731

    # ============================================================ loss / step
    logs: dict[str, list[float]] = {}
    # Pre-update entropy and KL, summed over reply tokens of the first pass (the scoring pass's
    # values when there was one): parameters only move at the accumulation boundary.
    ent_sum = kl_sum = n_tok = 0.0
    B = len(batch)
    # During critic warm-up the actor's forward still runs (for its metrics) but it does not learn.
    train_actor = critic is None or step >= algo.critic_warmup
    for epoch in range(algo.ppo_epochs):
        order = torch.from_numpy(step_rng(cfg.train.seed, step, 1 + epoch, actor.rank).permutation(B)).to(lengths.device)
        for mb in torch.tensor_split(order, algo.mini_batches):
            # Micro-batches of similar lengths, each cut to its own longest row: multi-turn
            # episodes differ several-fold in length, and padding would dominate the update.
            mb = mb[micro_batch_order(lengths[mb], None if p["groups"] is None else p["groups"][mb])]
            for rows in torch.tensor_split(mb, cfg.train.grad_accum):
                # An empty micro-batch still takes part, with zero weight, so DeepSpeed's
                # accumulation boundary stays aligned with the mini-batch.
                weight = 1.0 if len(rows) else 0.0
                rows = rows if len(rows) else mb[:1]
                L = int(lengths[rows].max())
                ids, attn, m_full = p["input_ids"][rows, :L], p["attention_mask"][rows, :L], mask[rows, :L - 1]
                with torch.set_grad_enabled(train_actor):
                    logits, start = forward_window(actor.forward, ids, attn,
                                                   prefix_len=None if p["prefix_len"] is None else p["prefix_len"][rows],
                                                   logit_chunk=cfg.train.logit_chunk)
                    w = lambda x: None if x is None else window(x, start, logits.shape[1])  # noqa: E731
                    m = w(m_full)  # the actor's per-token tensors live in the logits' window
                    terms = actor_loss_terms(logits, w(ids[:, 1:]), m, w(cut(p["old_logp"], rows, L)),
                                             w(p["advantages"][rows, :L - 1]), w(cut(p["ref_logp"], rows, L)),
                                             clip_low=algo.clip_low, clip_high=algo.clip_high, agg=algo.loss_agg,
                                             kl_estimator=algo.kl_estimator)
                loss = terms["pg"]
                if algo.entropy_coef:  # actor/entropy is logged either way
                    loss = loss - algo.entropy_coef * terms["entropy"]
                if reference is not None and algo.kl_placement == "in_loss":
                    loss = loss + algo.kl_coef * terms["kl"]
                if train_actor:
                    actor.backward(loss * loss_scale * weight)
                    actor.step()
                if epoch == 0 and weight and p["old_logp"] is None:
                    ent_sum += float((terms["entropy_tok"] * m).sum())
                    if reference is not None:
                        kl_tok = kl_penalty(terms["logp"], w(p["ref_logp"][rows, :L - 1]), estimator=algo.kl_estimator)
                        kl_sum += float((kl_tok * m).sum())
                    n_tok += float(m.sum())
                for k in ("pg", "clipfrac", "approx_kl"):
                    logs.setdefault({"pg": "actor/pg_loss"}.get(k, f"actor/{k}"), []).append(float(terms[k].detach()))
                if critic is not None:
                    values = critic.forward(input_ids=ids, attention_mask=attn).logits[:, :-1, 0].float()
                    vloss, vstats = value_loss(values, p["old_values"][rows, :L - 1], p["returns"][rows, :L - 1], m_full,
                                               clip=algo.value_clip, agg=algo.loss_agg)
                    critic.backward(vloss * weight)
                    critic.step()
                    logs.setdefault("critic/value_loss", []).append(float(vloss.detach()))
                    logs.setdefault("critic/vf_clipfrac", []).append(float(vstats["vf_clipfrac"]))
            logs.setdefault("actor/grad_norm", []).append(actor.grad_norm() if train_actor else float("nan"))

    # ============================================================ metrics
    out = {k: float(np.mean(v)) for k, v in logs.items()}
    if p["old_logp"] is not None:
        out["actor/entropy"] = float(aggregate(p["old_entropy"], mask, mode="token-mean"))
        kl = (kl_penalty(p["old_logp"], p["ref_logp"], estimator=algo.kl_estimator)
              if reference is not None else None)
        out["actor/kl"] = float(aggregate(kl, mask, mode="token-mean")) if kl is not None else float("nan")
    else:
        out["actor/entropy"] = ent_sum / max(n_tok, 1.0)
        out["actor/kl"] = kl_sum / max(n_tok, 1.0) if reference is not None else float("nan")
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
