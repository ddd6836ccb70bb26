"""From a batch to the loss: the objective's numbers from the config (`build_objective`), the
padded batch with its behaviour / reference log-probs and advantages (`prepare`), and the
ppo_epochs x mini_batches optimizer steps over it (`update`). What the loss is, and every KL
decision, is `algo/objective.py`'s; this file feeds it.

    obj = build_objective(cfg)
    metrics = update(ctx, batch.select(kept_rows), row_weight[kept_rows], step, scale)
"""
from __future__ import annotations

import functools
import operator

import numpy as np
import torch

from ragen2_core.algo.advantages import broadcast_to_tokens, gae_advantages, group_advantages, whiten
from ragen2_core.algo.losses import aggregate, kl_penalty, logp_entropy, value_loss
from ragen2_core.algo.objective import Objective, actor_terms, rewards_with_kl
from ragen2_core.config import SINGLE_TURN_ENVS
from ragen2_core.train.scoring import score_tokens, score_values
from ragen2_core.train.shared_prefix import RowPlan, forward_window, micro_batch_order, upload, window
from ragen2_core.train.state import RunContext, learner_stream, step_rng
from ragen2_core.batches import PreparedBatch, RolloutBatch


def build_objective(cfg) -> Objective:
    """The actor objective's numbers from the config; Dr.GRPO's length constant resolved here."""
    algo = cfg.algo
    norm_len = None
    if algo.loss_agg == "seq-mean-token-sum":
        turns = 1 if cfg.env.name in SINGLE_TURN_ENVS else cfg.env.max_turns
        norm_len = float(algo.loss_norm_len or turns * cfg.rollout.max_new_tokens)
    return Objective(clip_low=algo.clip_low, clip_high=algo.clip_high, clip_ratio_c=algo.clip_ratio_c,
                     agg=algo.loss_agg, norm_len=norm_len, entropy_coef=algo.entropy_coef, kl_coef=algo.kl_coef,
                     kl_estimator=algo.kl_estimator, kl_placement=algo.kl_placement,
                     scale_on=cfg.filter.loss_scale_on)


def prepare(ctx: RunContext, batch: RolloutBatch, row_weight: torch.Tensor, *, on_policy: bool) -> PreparedBatch:
    """Padded tensors, behaviour and reference log-probs, and advantages for a batch.

    With ``on_policy`` (one epoch, one mini-batch) the behaviour log-probs are not scored here: the
    update's own forward pass gives them, since the parameters do not move before its single step.
    """
    algo, obj, actor = ctx.cfg.algo, ctx.objective, ctx.actor
    device = next(actor.module.parameters()).device
    t = {k: v.to(device) for k, v in batch.padded(ctx.tok.pad_token_id).items()}
    mask = t["response_mask"][:, 1:]            # next-token positions that are reply tokens
    share = dict(prefix_len=torch.tensor(batch.prompt_len, device=device),
                 groups=torch.tensor(batch.group_ids, device=device)
                 ) if ctx.cfg.train.shared_prefix else dict(prefix_len=None, groups=None)
    old_logp = old_entropy = ref_logp = old_values = returns = None
    if not on_policy or obj.kl_in_reward:
        old_logp, old_entropy = score_tokens(actor.module, t, ctx.micro, **share, logit_chunk=ctx.cfg.train.logit_chunk)
    if obj.uses_reference:
        ref_logp, _ = score_tokens(ctx.reference.module, t, ctx.micro, **share, logit_chunk=ctx.cfg.train.logit_chunk)
    rewards = rewards_with_kl(obj, t["token_rewards"][:, 1:], old_logp, ref_logp, mask)
    if ctx.critic is not None:
        old_values = score_values(ctx.critic.module, t, ctx.micro, **share)
        advantages, returns = gae_advantages(rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam)
    else:
        seq_adv = group_advantages(rewards.sum(-1), torch.tensor(batch.group_ids, device=device),
                                   norm_by_std=algo.advantage == "grpo")
        advantages = broadcast_to_tokens(seq_adv, mask)
    if ctx.whiten:
        advantages = whiten(advantages, mask)
    advantages = advantages * row_weight.to(device)[:, None]   # soft reweighting (ones when off)
    if ctx.cfg.filter.zero_task_advantage:
        advantages = torch.zeros_like(advantages)
    return PreparedBatch(input_ids=t["input_ids"], attention_mask=t["attention_mask"], mask=mask,
                         advantages=advantages, lengths=t["attention_mask"].sum(-1), old_logp=old_logp,
                         old_entropy=old_entropy, ref_logp=ref_logp, old_values=old_values, returns=returns, **share)


def read_floats(logs: dict[str, list]) -> dict[str, list[float]]:
    """The update's logged values as floats, tensors among them read from the device at once."""
    tensors = [x for v in logs.values() for x in v if isinstance(x, torch.Tensor)]
    read = iter(torch.stack([t.detach().double() for t in tensors]).tolist() if tensors else [])
    return {k: [next(read) if isinstance(x, torch.Tensor) else float(x) for x in v] for k, v in logs.items()}


def update(ctx: RunContext, batch: RolloutBatch, row_weight: torch.Tensor, step: int, scale: float,
           weight: float = 1.0) -> dict[str, float]:
    """Advantages, then ppo_epochs x mini_batches optimizer steps over the kept rows; `scale` is the
    filter's loss scale (`algo/objective.py` decides what it multiplies). `weight` 0 takes part in
    the steps without contributing (a data-parallel rank with nothing kept).

    Nothing in the micro-batch loop waits for the device: the micro-batches are planned on the host
    from the batch's own lists, and the metrics stay tensors until one read at the end."""
    algo, obj, actor, critic = ctx.cfg.algo, ctx.objective, ctx.actor, ctx.critic
    # ============================================================ advantage
    on_policy = algo.ppo_epochs == 1 and algo.mini_batches == 1
    p = prepare(ctx, batch, row_weight, on_policy=on_policy)
    mask, device = p.mask, p.input_ids.device
    cut = lambda x, rows, L: None if x is None else x[rows, :L - 1]  # noqa: E731
    lengths = np.array([len(ids) for ids in batch.token_ids])          # p.lengths, known on the host
    groups = None if p.groups is None else np.array(batch.group_ids)
    prompts: dict[tuple, int] = {}
    prompt_id = [prompts.setdefault(tuple(ids[:k]), len(prompts)) for ids, k in zip(batch.token_ids, batch.prompt_len)]
    plan = lambda rows: None if p.prefix_len is None else RowPlan(  # noqa: E731
        lengths=lengths[rows].tolist(), prefix_len=[batch.prompt_len[b] for b in rows],
        prompt=[prompt_id[b] for b in rows])

    # ============================================================ loss / step
    logs: dict[str, list] = {}
    # Pre-update entropy and KL, summed over reply tokens of the first pass (the scoring pass's
    # values when there was one): parameters only move at the accumulation boundary.
    sums: dict[str, list] = {"entropy": [], "kl": [], "tokens": []}
    B = len(batch)
    # During critic warm-up the actor's forward still runs (for its metrics) but it does not learn.
    train_actor = critic is None or step >= algo.critic_warmup
    for epoch in range(algo.ppo_epochs):
        order = step_rng(ctx.cfg.train.seed, step, learner_stream(epoch), actor.rank).permutation(B)
        for mb in np.array_split(order, algo.mini_batches):
            # Micro-batches of similar lengths, each cut to its own longest row: multi-turn
            # episodes differ several-fold in length, and padding would dominate the update.
            mb = mb[micro_batch_order(lengths[mb], None if groups is None else groups[mb])]
            for host_rows in np.array_split(mb, ctx.cfg.train.grad_accum):
                # An empty micro-batch still takes part, with zero weight, so DeepSpeed's
                # accumulation boundary stays aligned with the mini-batch.
                mb_weight = weight if len(host_rows) else 0.0
                host_rows = host_rows if len(host_rows) else mb[:1]
                L = int(lengths[host_rows].max())
                rows = upload(host_rows.tolist(), device)
                ids, attn, m_full = p.input_ids[rows, :L], p.attention_mask[rows, :L], mask[rows, :L - 1]
                prefix = None if p.prefix_len is None else p.prefix_len[rows]
                with torch.set_grad_enabled(train_actor):
                    logits, start = forward_window(actor.forward, ids, attn, prefix_len=prefix,
                                                   logit_chunk=ctx.cfg.train.logit_chunk, plan=plan(host_rows))
                    w = lambda x: None if x is None else window(x, start, logits.shape[1])  # noqa: E731
                    m = w(m_full)  # the actor's per-token tensors live in the logits' window
                    logp, entropy_tok = logp_entropy(logits, w(ids[:, 1:]))
                    terms = actor_terms(obj, logp, entropy_tok, m, w(cut(p.old_logp, rows, L)),
                                        w(p.advantages[rows, :L - 1]), w(cut(p.ref_logp, rows, L)), scale=scale)
                if train_actor:
                    actor.backward(terms["loss"] * mb_weight)
                    actor.step()
                if epoch == 0 and mb_weight and p.old_logp is None:
                    sums["entropy"].append((entropy_tok.detach() * m).sum())
                    if obj.uses_reference:
                        kl_tok = kl_penalty(logp.detach(), w(p.ref_logp[rows, :L - 1]), estimator=obj.kl_estimator)
                        sums["kl"].append((kl_tok * m).sum())
                    sums["tokens"].append(m.sum())
                for k in ("pg", "clipfrac", "clipfrac_lower", "approx_kl"):
                    logs.setdefault({"pg": "actor/pg_loss"}.get(k, f"actor/{k}"), []).append(terms[k].detach())
                if critic is not None:
                    v, v_start = forward_window(critic.forward, ids, attn, prefix_len=prefix, plan=plan(host_rows))
                    wv = lambda x: window(x, v_start, v.shape[1])  # noqa: E731
                    vloss, vstats = value_loss(v[..., 0], wv(cut(p.old_values, rows, L)), wv(cut(p.returns, rows, L)),
                                               wv(m_full), clip=algo.value_clip, agg=algo.loss_agg)
                    critic.backward(vloss * mb_weight)
                    critic.step()
                    logs.setdefault("critic/value_loss", []).append(vloss.detach())
                    logs.setdefault("critic/vf_clipfrac", []).append(vstats["vf_clipfrac"])
            logs.setdefault("actor/grad_norm", []).append(actor.last_grad_norm() if train_actor else float("nan"))

    # ============================================================ metrics
    values = read_floats(logs | {f"sum/{k}": v for k, v in sums.items()})
    total = lambda k: functools.reduce(operator.add, values.pop(f"sum/{k}"), 0.0)  # noqa: E731  in loop order
    ent_sum, kl_sum, n_tok = total("entropy"), total("kl"), total("tokens")
    out = {k: float(np.mean(v)) for k, v in values.items()}
    if p.old_logp is not None:
        out["actor/entropy"] = float(aggregate(p.old_entropy, mask, mode="token-mean"))
        kl = (kl_penalty(p.old_logp, p.ref_logp, estimator=obj.kl_estimator)
              if obj.uses_reference else None)
        out["actor/kl"] = float(aggregate(kl, mask, mode="token-mean")) if kl is not None else float("nan")
    else:
        out["actor/entropy"] = ent_sum / max(n_tok, 1.0)
        out["actor/kl"] = kl_sum / max(n_tok, 1.0) if obj.uses_reference else float("nan")
    out["actor/lr"] = actor.lr()
    if critic is None:
        out |= {"critic/value_loss": float("nan"), "critic/vf_clipfrac": float("nan")}
    return out
