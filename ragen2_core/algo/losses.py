"""Policy-gradient losses: masked aggregation, PPO clipped surrogate, KL estimators, entropy, value loss.

All per-token tensors are [B, T] with a `mask [B, T]` (bool or {0, 1} float) marking the tokens that
count. Masked-out positions may hold anything (padding logits, -inf log-probs): they are replaced by 0
before any reduction, so they never turn a loss into NaN.

The clip and clamp constants follow veRL (`verl/trainer/ppo/core_algos.py`, the version the RAGEN-2
release pins): the log-ratio is clamped to +-20 before exp, dual-clip PPO caps a negative-advantage
token's loss at clip_ratio_c * |A|, and k3 clamps its log-ratio to +-20 and itself to [-10, 10].

Log-probs and entropies take either full logits [B, T, V] or `HeadLogits` (the hidden states before
the output head plus its weight): the latter are turned into logits a chunk of positions at a time,
forward and backward, so no [B, T, V] float32 tensor is ever held (at a 152k vocabulary those are
most of a training step's memory).

Usage:
    per_token_logp = logp_from_logits(logits, token_ids)
    logp, entropy = logp_entropy(HeadLogits(hidden, lm_head.weight, chunk=256), token_ids)
    loss, stats = policy_loss(per_token_logp, old_logp, token_adv, mask,
                              clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, agg="token-mean")
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3", "k3_exact")
LOG_RATIO_CLAMP = 20.0   # veRL: keeps exp() of a log-ratio finite
K3_CLAMP = 10.0          # veRL's low_var_kl bound on the k3 value


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask is set, 0 elsewhere (a plain product would keep NaN/inf from padding)."""
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def aggregate(
    loss_mat: torch.Tensor, mask: torch.Tensor, *, mode: str, norm_len: float | None = None
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    Args:
        loss_mat: [B, T] float per-token loss.
        mask: [B, T] bool or {0, 1} float.
        mode: "token-mean": sum over masked tokens / number of masked tokens in the batch.
            "seq-mean-token-mean": masked mean per row, then mean over rows with >= 1 masked token.
            "seq-mean-token-sum": masked sum per row (divided by `norm_len` when given, Dr.GRPO's fixed
            length constant), then mean over *all* rows: Dr.GRPO's 1/G, a constant, so a row without
            tokens adds 0 and does not raise the others' weight (TRL's dr_grpo divides by all rows too).
        norm_len: only for "seq-mean-token-sum".

    Returns:
        scalar tensor; 0 when no token is masked in.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"aggregate: unknown mode {mode!r}; expected one of {AGG_MODES}")
    if norm_len is not None and mode != "seq-mean-token-sum":
        raise ValueError(f"aggregate: norm_len is only used by 'seq-mean-token-sum', got mode {mode!r}")
    weights = mask.to(loss_mat.dtype)
    masked_loss = _masked(loss_mat, mask) * weights
    if mode == "token-mean":
        return masked_loss.sum() / weights.sum().clamp_min(1.0)
    row_tokens = weights.sum(dim=-1)  # [B]
    row_sum = masked_loss.sum(dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        row_loss = row_sum / row_tokens.clamp_min(1.0)
    else:
        row_loss = row_sum / norm_len if norm_len is not None else row_sum
    has_tokens = (row_tokens > 0).to(loss_mat.dtype)
    if mode == "seq-mean-token-sum":
        return (row_loss * has_tokens).sum() / max(1, row_loss.shape[0])
    # A per-row mean of a row without tokens is undefined, not 0: such rows (e.g. fully truncated)
    # stay out of the mean rather than dilute it.
    return (row_loss * has_tokens).sum() / has_tokens.sum().clamp_min(1.0)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scalar mean of x over masked tokens; 0 if none."""
    weights = mask.to(x.dtype)
    return (_masked(x, mask) * weights).sum() / weights.sum().clamp_min(1.0)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
    agg: str,
    norm_len: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with an asymmetric ratio range [1 - clip_low, 1 + clip_high], and dual clip.

    Per token, with r = exp(clamp(logp - old_logp, -20, 20)):
        l = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))
        dual clip (clip_ratio_c = c > 1, tokens with A < 0 only): l = min(l, -A * c) = min(l, c * |A|),
        so a token whose ratio ran far above 1 + clip_high has a bounded loss and no gradient
        (Ye et al. 2020, arXiv:1912.09729; veRL's default c = 3). None turns it off.

    Args:
        logp: [B, T] per-token log-prob under the current policy (carries the gradient).
        old_logp: [B, T] per-token log-prob under the rollout policy.
        advantages: [B, T] per-token advantage.
        mask: [B, T] response tokens to train on.
        clip_low, clip_high: ratio clip distances below and above 1.
        clip_ratio_c: dual-clip bound (> 1), or None.
        agg: aggregation mode, see `aggregate`; `norm_len` is passed through.

    Returns:
        (loss, stats): loss is a scalar; stats holds detached scalars `clipfrac` (fraction of masked
        tokens where the clipped branch was the active maximum), `clipfrac_lower` (fraction where the
        dual clip was active; 0 without it), `approx_kl` (mean of old_logp - logp), `ratio_mean`.
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"policy_loss: clip_ratio_c must be > 1 (or None for no dual clip), got {clip_ratio_c}")
    # 0 on padding keeps exp() finite; the clamp does the same for a runaway ratio.
    log_ratio = torch.clamp(_masked(logp - old_logp.detach(), mask), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    adv = _masked(advantages.detach(), mask)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token_loss = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(per_token_loss, dtype=torch.bool)
    if clip_ratio_c is not None:
        cap = -adv * clip_ratio_c
        dual_active = (adv < 0) & (per_token_loss > cap)
        per_token_loss = torch.where(dual_active, cap, per_token_loss)
    loss = aggregate(per_token_loss, mask, mode=agg, norm_len=norm_len)
    with torch.no_grad():
        stats = {
            "clipfrac": _masked_mean((clipped > unclipped).to(logp.dtype), mask),
            "clipfrac_lower": _masked_mean(dual_active.to(logp.dtype), mask),
            "approx_kl": _masked_mean(-log_ratio, mask),
            "ratio_mean": _masked_mean(ratio, mask),
        }
    return loss, stats


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, *, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1 / k2 / k3).

    With d = logp - ref_logp:
        k1 = d                                  (unbiased, high variance, can be negative)
        k2 = 0.5 * d**2                         (biased, low variance, >= 0)
        k3 = clamp(exp(c) - c - 1, -10, 10)     with c = clamp(-d, -20, 20): veRL's "low_var_kl",
                                                 bounded so one far-off token cannot dominate (its
                                                 gradient is 0 once clamped)
        k3_exact = exp(-d) + d - 1              (unbiased, low variance, >= 0, unbounded)

    Args:
        logp, ref_logp: [...] log-probs of the sampled tokens; any matching shape.

    Returns:
        [...] per-token estimate, same shape; mask and aggregate it with `aggregate`.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_penalty: unknown estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff**2
    if estimator == "k3_exact":
        return torch.exp(-diff) + diff - 1.0
    c = torch.clamp(-diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(c) - c - 1.0, -K3_CLAMP, K3_CLAMP)


@dataclasses.dataclass
class HeadLogits:
    """Logits not yet computed: ``F.linear(hidden, weight).float()``, evaluated `chunk` positions at a
    time by `logp_entropy` (forward, and again in backward: nothing vocabulary-sized is saved).

    hidden: [B, T, D] in the model's dtype; weight: [V, D] the output head (no bias); chunk: positions
    per evaluation (the transient memory is a few [chunk, V] float32 tensors).
    """
    hidden: torch.Tensor
    weight: torch.Tensor
    chunk: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.hidden.shape[:-1], self.weight.shape[0]))


def _dense_logp_entropy(logits: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor, torch.Tensor]:
    """(per-token log-prob, entropy, log-softmax, softmax) of float logits [..., V]."""
    # log_softmax shifts by the max first; gather(logits) - logsumexp(logits) would subtract two
    # large numbers and lose float32 precision when logits are big.
    per_vocab_logp = torch.log_softmax(logits, dim=-1)
    probs = per_vocab_logp.exp()
    # 0 * log 0 is 0; zeroing log p first also keeps the backward pass free of NaN.
    safe_logp = torch.where(probs > 0, per_vocab_logp, torch.zeros_like(per_vocab_logp))
    entropy = -(probs * safe_logp).sum(dim=-1)
    logp = torch.gather(per_vocab_logp, -1, token_ids.unsqueeze(-1)).squeeze(-1)
    return logp, entropy, safe_logp, probs


class _ChunkedHead(torch.autograd.Function):
    """Per-token log-prob and entropy of ``F.linear(hidden, weight).float()`` [N, V], a chunk of rows
    at a time; backward recomputes each chunk's logits (as veRL's FusedLinearForPPO does).

    Gradients, with p = softmax(z), H = -sum_v p_v log p_v, for one position and its token y:
        d logp_y / d z_v = 1[v = y] - p_v
        d H / d z_v      = -p_v (log p_v + H)
    then dL/dhidden = g_z @ W and dL/dW = g_z^T @ hidden, with g_z cast to the weight's dtype as the
    unchunked linear's backward would receive it.
    """

    @staticmethod
    def forward(ctx, hidden, weight, token_ids, chunk):
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = torch.empty_like(logp)
        for s in range(0, hidden.shape[0], chunk):
            z = F.linear(hidden[s:s + chunk], weight).float()
            logp[s:s + chunk], entropy[s:s + chunk], *_ = _dense_logp_entropy(z, token_ids[s:s + chunk])
        ctx.save_for_backward(hidden, weight, token_ids)
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)   # an unused output (often the entropy) costs nothing
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        hidden, weight, token_ids = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        if g_logp is None and g_entropy is None:
            return grad_h, grad_w, None, None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h, ids = hidden[s:s + ctx.chunk], token_ids[s:s + ctx.chunk]
            z = F.linear(h, weight).float()
            _, entropy, safe_logp, probs = _dense_logp_entropy(z, ids)
            g_z = torch.zeros_like(z)
            if g_logp is not None:
                g = g_logp[s:s + ctx.chunk, None]
                g_z -= probs * g
                g_z.scatter_add_(1, ids[:, None], g)
            if g_entropy is not None:
                g_z -= probs * (safe_logp + entropy[:, None]) * g_entropy[s:s + ctx.chunk, None]
            g_z = g_z.to(weight.dtype)
            if need_h:
                grad_h[s:s + ctx.chunk] = g_z @ weight
            if need_w:
                grad_w += (g_z.t() @ h).float()
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None


def logp_entropy(logits: torch.Tensor | HeadLogits, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of the given token ids and the policy entropy at each position, in one pass.

    Args:
        logits: [B, T, V] float, or `HeadLogits` whose shape is [B, T, V]; position t scores
            token_ids[:, t] (shift before calling if the logits at t predict token t + 1).
        token_ids: [B, T] long.

    Returns:
        ([B, T], [B, T]) float32: log p(token) and H = -sum_v p_v log p_v, both differentiable.
    """
    if isinstance(logits, HeadLogits):
        lead = logits.hidden.shape[:-1]
        flat = logits.hidden.reshape(-1, logits.hidden.shape[-1])
        logp, entropy = _ChunkedHead.apply(flat, logits.weight, token_ids.reshape(-1), max(1, logits.chunk))
        return logp.view(lead), entropy.view(lead)
    logp, entropy, *_ = _dense_logp_entropy(logits, token_ids)
    return logp, entropy


def entropy_from_logits(logits: torch.Tensor | HeadLogits) -> torch.Tensor:
    """Entropy of the softmax distribution per position.

    Args:
        logits: [B, T, V] float (-inf entries, banned tokens, are allowed), or `HeadLogits`.

    Returns:
        [B, T] float, H = -sum_v p_v log p_v with log p = logits - logsumexp(logits), computed by
        log_softmax (max-shifted, so large logits lose no precision).
    """
    if isinstance(logits, HeadLogits):
        return logp_entropy(logits, torch.zeros(logits.shape[:-1], dtype=torch.long,
                                                device=logits.hidden.device))[1]
    per_vocab_logp = torch.log_softmax(logits, dim=-1)
    probs = per_vocab_logp.exp()
    safe_logp = torch.where(probs > 0, per_vocab_logp, torch.zeros_like(per_vocab_logp))
    return -(probs * safe_logp).sum(dim=-1)


def logp_from_logits(logits: torch.Tensor | HeadLogits, token_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of given token ids.

    Args:
        logits: [B, T, V] float, or `HeadLogits`; position t scores token_ids[:, t] (shift before
            calling if the logits at t predict token t + 1).
        token_ids: [B, T] long.

    Returns:
        [B, T] float per-token log-prob.
    """
    if isinstance(logits, HeadLogits):
        return logp_entropy(logits, token_ids)[0]
    per_vocab_logp = torch.log_softmax(logits, dim=-1)
    return torch.gather(per_vocab_logp, -1, token_ids.unsqueeze(-1)).squeeze(-1)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None,
    agg: str,
    norm_len: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO value loss: 0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped = old + clamp(v - old, +-clip).

    Args:
        values: [B, T] current critic values (carries the gradient).
        old_values: [B, T] critic values at rollout time.
        returns: [B, T] regression targets.
        mask: [B, T] tokens to train on.
        clip: clip distance; None trains on the unclipped error only.
        agg: aggregation mode, see `aggregate`; `norm_len` is passed through.

    Returns:
        (loss, stats): scalar loss; stats `vf_clipfrac` = fraction of masked tokens where the clipped
        error was the larger one.
    """
    returns = returns.detach()
    err_unclipped = (values - returns) ** 2
    if clip is None:
        err = err_unclipped
        clipfrac = values.new_zeros(())
    else:
        old_values = old_values.detach()
        values_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err_clipped = (values_clipped - returns) ** 2
        err = torch.maximum(err_unclipped, err_clipped)
        with torch.no_grad():
            clipfrac = _masked_mean((err_clipped > err_unclipped).to(values.dtype), mask)
    loss = 0.5 * aggregate(err, mask, mode=agg, norm_len=norm_len)
    return loss, {"vf_clipfrac": clipfrac}
