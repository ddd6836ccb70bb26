"""Gradient probe: the task, KL and entropy components of the actor gradient, measured separately.

Run on the whole rollout batch (before the filter), at the current parameters, with the ratio at 1
(on-policy), so it shows what each term would contribute to this step's update, per band of
in-group reward spread. Gradients are taken with `torch.autograd.grad` on the bare module, so the
optimizer's accumulated gradients are untouched. The loss of a row set is rebuilt from micro-batches
weighted by their share of rows, which is exact for per-sequence aggregation and close otherwise.
The spread bands partition the batch, so the whole batch's components are their weighted sum: each
row is differentiated once per component.

The components are the objective's own weighted terms (`algo/objective.py`: task, entropy, KL,
with the step's filter loss scale), so the probe measures exactly what the update optimises. KL
placed `in_reward` acts through the advantages, so it is part of the task component there and the
KL component is off; likewise a zero coefficient switches a component off (the work is skipped).

    stats = gradient_probe(actor.module, prepared, [all_rows, low_spread_rows], objective=obj, micro=16)
    metrics = probe_batch(actor.module, prepared, batch.group_ids, group_reward_std, objective=obj,
                          buckets=2, micro=16)
"""
from __future__ import annotations

import torch

from ragen2_core.algo.losses import entropy_from_logits, logp_from_logits
from ragen2_core.algo.objective import Objective, actor_terms
from ragen2_core.metrics.gradients import decomposition_stats, spread_buckets
from ragen2_core.train.shared_prefix import forward_window, micro_batch_order, window
from ragen2_core.batches import PreparedBatch


def gradient_probe(model, prep: PreparedBatch, row_sets: list[torch.Tensor], *, objective: Objective, micro: int,
                   scale: float = 1.0) -> list[dict | None]:
    """`decomposition_stats` for each row set (None for an empty set)."""
    return [decomposition_stats(accumulate(model, prep, rows, objective=objective, micro=micro, scale=scale))
            if len(rows) else None for rows in row_sets]


def active_components(objective: Objective) -> dict[str, bool]:
    return {"task": True, "kl": objective.kl_in_loss, "entropy": bool(objective.entropy_coef)}


def accumulate(model, prep: PreparedBatch, rows: torch.Tensor, *, objective: Objective, micro: int,
               scale: float = 1.0) -> dict[str, list[torch.Tensor] | None]:
    """Each weighted component's gradient over ``rows``, micro-batch by micro-batch, each weighted by
    its share of the rows; None for a component that is switched off."""
    params = [p for p in model.parameters() if p.requires_grad]
    on = active_components(objective)
    active = [c for c, a in on.items() if a]
    acc = {c: [torch.zeros_like(p) for p in params] for c in active}
    groups, prefix = prep.groups, prep.prefix_len
    rows = rows[micro_batch_order(prep.lengths[rows], None if groups is None else groups[rows])]
    for mb in torch.split(rows, micro):
        L = int(prep.lengths[mb].max())
        ids, attn = prep.input_ids[mb, :L], prep.attention_mask[mb, :L]
        logits, start = forward_window(model, ids, attn, prefix_len=None if prefix is None else prefix[mb])
        # per-token tensors cut to the rows and moved into the logits' window
        cut = lambda x: None if x is None else window(x[mb, :L - 1], start, logits.shape[1])  # noqa: E731
        logp = logp_from_logits(logits, window(ids[:, 1:], start, logits.shape[1]))
        terms = actor_terms(objective, logp, entropy_from_logits(logits), cut(prep.mask), None,
                            cut(prep.advantages), cut(prep.ref_logp), scale=scale)
        share = len(mb) / len(rows)
        for i, c in enumerate(active):
            grads = torch.autograd.grad(share * terms[c], params,
                                        retain_graph=i < len(active) - 1, allow_unused=True)
            for a, g in zip(acc[c], grads):
                if g is not None:
                    a.add_(g)
    return {c: acc.get(c) for c in on}


def combine(parts: list[tuple[int, dict]]) -> dict[str, list[torch.Tensor] | None]:
    """The whole batch's components from those of a partition of its rows, [(n_rows, acc), ...]:
    the row-share-weighted sum, so the batch needs no pass of its own. Exact when the loss is a
    mean over sequences (seq-mean-*), close for a token mean (micro-batches then weigh rows by
    their share, not their tokens, in either computation)."""
    total = sum(n for n, _ in parts)
    out = {}
    for c, first in parts[0][1].items():
        out[c] = None if first is None else [sum(n / total * acc[c][i] for n, acc in parts)
                                             for i in range(len(first))]
    return out


def probe_batch(model, prep: PreparedBatch, group_ids: list[int], spread: torch.Tensor, *, objective: Objective,
                buckets: int, micro: int, scale: float = 1.0) -> dict[str, float]:
    """The logged metrics: `actor/grad_norm_*` over the whole batch and `grad_probe/b{i}/*` per band
    of in-group reward spread (`buckets` quantile bands, b0 = lowest spread)."""
    group_of_row = torch.tensor(group_ids)
    bucket_of_row = spread_buckets(spread, n_buckets=buckets)[group_of_row]
    n_buckets = buckets if buckets > 1 else 0
    row_sets = [torch.arange(len(group_ids))] + [torch.nonzero(bucket_of_row == b).flatten() for b in range(n_buckets)]
    row_sets = [r.to(prep.lengths.device) for r in row_sets]
    kw = dict(objective=objective, micro=micro, scale=scale)
    if n_buckets:
        # The buckets partition the batch: its components are their weighted sum (one pass, not two).
        accs = [accumulate(model, prep, r, **kw) if len(r) else None for r in row_sets[1:]]
        whole = combine([(len(r), a) for r, a in zip(row_sets[1:], accs) if a is not None])
        stats = [decomposition_stats(whole)] + [None if a is None else decomposition_stats(a) for a in accs]
    else:
        stats = gradient_probe(model, prep, row_sets[:1], **kw)
    out = {f"actor/{k}": v for k, v in stats[0].items()}
    for b, st in enumerate(stats[1:]):
        rows = row_sets[b + 1]
        out[f"grad_probe/b{b}/group_reward_std"] = float(spread[group_of_row[rows]].mean()) if len(rows) else float("nan")
        for k, v in (st or {}).items():
            out[f"grad_probe/b{b}/{k}"] = v
    return out
