"""Scoring passes: the per-token log-probs, entropies and values of a padded batch, without gradients,
in row chunks of similar length (and prompt-sharing order when ``prefix_len`` is given).

    logp, entropy = score_tokens(model, batch.padded(pad_id), micro=8)      # [B, T-1] each
    values = score_values(critic, t, micro=8)                               # [B, T-1]
    logp_mismatch(model, batch, pad_id=pad_id, micro=8)   # the sampler's log-probs against these
"""
from __future__ import annotations

import torch

from ragen2_core.algo.losses import logp_entropy
from ragen2_core.train.shared_prefix import forward_window, micro_batch_order, unwindow, window


def scoring_chunks(t: dict, micro: int, prefix_len: torch.Tensor | None, groups: torch.Tensor | None):
    """Row chunks of a scoring pass: in length order (group by group when sharing), each cut to its
    longest row. Yields (rows, ids [R, L], attn [R, L], the rows' prefix_len or None)."""
    lengths = t["attention_mask"].sum(-1)
    for rows in torch.split(micro_batch_order(lengths, groups if prefix_len is not None else None), micro):
        L = int(lengths[rows].max())
        yield (rows, t["input_ids"][rows, :L], t["attention_mask"][rows, :L],
               None if prefix_len is None else prefix_len[rows])


@torch.no_grad()
def score_tokens(model, t: dict, micro: int, *, prefix_len: torch.Tensor | None = None,
                 groups: torch.Tensor | None = None, logit_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of each next token and the policy entropy there, [B, T-1] each (zero
    past a row's end, and before the last prompt token when ``prefix_len`` shares prompts)."""
    B, T = t["input_ids"].shape
    device = t["input_ids"].device
    logp, entropy = torch.zeros(B, T - 1, device=device), torch.zeros(B, T - 1, device=device)
    for rows, ids, attn, prefix in scoring_chunks(t, micro, prefix_len, groups):
        L = ids.shape[1]
        logits, start = forward_window(model, ids, attn, prefix_len=prefix, logit_chunk=logit_chunk)
        w = lambda x: window(x, start, logits.shape[1])  # noqa: E731
        real = w(attn[:, 1:].float())
        lp, ent = logp_entropy(logits, w(ids[:, 1:]))
        logp[rows, :L - 1] = unwindow(lp * real, start, L - 1)
        entropy[rows, :L - 1] = unwindow(ent * real, start, L - 1)
    return logp, entropy


@torch.no_grad()
def score_values(critic, t: dict, micro: int, *, prefix_len: torch.Tensor | None = None,
                 groups: torch.Tensor | None = None) -> torch.Tensor:
    """The critic's value at each next-token position, [B, T-1] (zero before each row's window and
    after its end): GAE reads values at reply positions only, so the shared prompts are encoded once."""
    B, T = t["input_ids"].shape
    values = torch.zeros(B, T - 1, device=t["input_ids"].device)
    for rows, ids, attn, prefix in scoring_chunks(t, micro, prefix_len, groups):
        v, start = forward_window(critic, ids, attn, prefix_len=prefix)
        values[rows, :ids.shape[1] - 1] = unwindow(v[..., 0], start, ids.shape[1] - 1)
    return values


def logp_mismatch(model, batch, *, pad_id: int, micro: int) -> dict[str, float]:
    """Max and mean |logp_sampler - logp_train| over the batch's reply tokens: how far the engine
    that sampled the batch (``batch.behavior_logp``, the vLLM backend's) is from the trained model."""
    device = next(model.parameters()).device
    t = {k: v.to(device) for k, v in batch.padded(pad_id).items()}
    train_logp, _ = score_tokens(model, t, micro)                        # [B, T-1]: token t+1
    T = t["input_ids"].shape[1]
    behaviour = torch.zeros(len(batch), T, device=device)
    for b, lp in enumerate(batch.behavior_logp):
        behaviour[b, :len(lp)] = torch.tensor(lp, device=device)
    mask = t["response_mask"][:, 1:].bool()
    gap = (behaviour[:, 1:] - train_logp).abs()[mask]
    if gap.numel() == 0:
        return {"rollout/logp_mismatch_max": float("nan"), "rollout/logp_mismatch_mean": float("nan")}
    return {"rollout/logp_mismatch_max": float(gap.max()), "rollout/logp_mismatch_mean": float(gap.mean())}
