"""Template-collapse metrics: mutual information between prompts and reasonings (in nats).

In-batch cross-scoring (REFERENCE.md section 2). Each reasoning z_{i,k} (the k-th sample for
prompt i) is teacher-forced under every prompt x_j of the batch:

    scores[i, k, j] = log p(z_{i,k} | x_j)                      shape [N, K, N]
    matched  = scores[i, k, i]
    marginal = logsumexp_j scores[i, k, j] - log N              (uniform over the batch's prompts)
    MI       = mean(matched - marginal)                         <= log N

Template collapse is MI -> 0 while the conditional entropy -mean(matched) stays high: the
reasonings stay diverse but stop depending on the prompt.

Usage::

    import torch
    from ragen2_core.metrics.collapse import collapse_metrics, ema_update

    scores = torch.randn(8, 4, 8)                 # [N prompts, K samples, N prompts]
    lengths = torch.randint(1, 50, (8, 4))        # reasoning lengths in tokens, [N, K]
    m = collapse_metrics(scores, lengths=lengths, n_perm=32, seed=0)
    z_ema = ema_update(None, m["mi_zscore"], decay=0.9)
"""
from __future__ import annotations

import math

import torch

TIE_RULES = ("split", "strict", "first")


def _prepare(scores, lengths, per_token: bool) -> torch.Tensor:
    """Validate ``scores`` [N, K, N] (and ``lengths`` [N, K]); return float64 scores, divided by
    the clamped lengths when ``per_token``."""
    s = torch.as_tensor(scores).detach().to(torch.float64)
    shape = tuple(s.shape)
    if s.dim() != 3 or shape[0] != shape[2]:
        raise ValueError(
            f"scores must have shape [N, K, N] with scores[i, k, j] = log p(z_ik | x_j); got shape "
            f"{shape}. Score every sampled reasoning under every prompt of the batch and stack them "
            f"as [prompt it was sampled from, sample index, prompt it is scored under].")
    n, k, _ = shape
    if n < 2:
        raise ValueError(
            f"MI needs at least 2 prompts (N >= 2); got scores of shape {shape}. Cross-score a batch "
            f"of at least two distinct prompts: with N = 1 the bound log N is 0.")
    if k < 1:
        raise ValueError(f"scores has no samples per prompt (K = 0); got shape {shape}.")
    if not torch.isfinite(s).all():
        raise ValueError(f"scores of shape {shape} contain NaN or inf; expected finite log-likelihoods.")
    if lengths is not None:
        ln = torch.as_tensor(lengths, device=s.device).detach().to(torch.float64)
        if tuple(ln.shape) != (n, k):
            raise ValueError(
                f"lengths must have shape [N, K] = {(n, k)} to match scores of shape {shape}; "
                f"got shape {tuple(ln.shape)}.")
    if per_token:
        if lengths is None:
            raise ValueError("per_token=True needs lengths of shape [N, K] (reasoning length in tokens).")
        # An empty reasoning has log-likelihood 0 anyway; clamping avoids 0/0 without inflating it.
        s = s / ln.clamp(min=1.0).unsqueeze(-1)
    return s


def _matched(s: torch.Tensor) -> torch.Tensor:
    """[N, K, N] -> [N, K]: each reasoning scored under its own prompt."""
    idx = torch.arange(s.shape[0], device=s.device)
    return s[idx, :, idx]


def _marginal(s: torch.Tensor) -> torch.Tensor:
    """[N, K, N] -> [N, K]: log of the uniform mixture over the batch's prompts."""
    return torch.logsumexp(s, dim=2) - math.log(s.shape[0])


def _retrieval(s: torch.Tensor, ties: str) -> torch.Tensor:
    """[N, K, N] -> [N, K] credit in [0, 1] for picking the right prompt by argmax_j."""
    n = s.shape[0]
    idx = torch.arange(n, device=s.device)
    if ties == "first":
        return (s.argmax(dim=2) == idx[:, None]).to(s.dtype)
    is_max = s == s.max(dim=2, keepdim=True).values
    hit = is_max[idx, :, idx]
    n_max = is_max.sum(dim=2)
    if ties == "strict":
        return (hit & (n_max == 1)).to(s.dtype)
    return hit.to(s.dtype) / n_max.to(s.dtype)


def mi_from_scores(scores, *, lengths=None, per_token: bool = False,
                   ties: str = "split") -> dict[str, float]:
    """MI estimate and companions from cross-scores.

    Args:
        scores: [N, K, N], ``scores[i, k, j] = log p(z_{i,k} | x_j)`` (sequence log-likelihood).
        lengths: [N, K] reasoning lengths in tokens; needed when ``per_token``.
        per_token: divide each score by ``max(lengths[i, k], 1)`` first.
        ties: how ``retrieval_acc`` credits a reasoning whose best prompts tie.
            ``"split"`` (default): 1/m if its own prompt is one of m tied maxima, i.e. the expected
            accuracy under uniform random tie-breaking, so prompt-blind scores give exactly chance;
            ``"strict"``: correct only if its own prompt is the unique maximum;
            ``"first"``: first-index argmax (biased towards prompt 0).

    Returns:
        ``mi`` = mean(matched - marginal); ``mi_upper_bound`` = log N; ``retrieval_acc``;
        ``retrieval_chance`` = 1/N; ``cond_entropy`` = -mean(matched);
        ``marginal_entropy`` = -mean(marginal). Note mi = marginal_entropy - cond_entropy.
    """
    if ties not in TIE_RULES:
        raise ValueError(f"ties must be one of {TIE_RULES}; got {ties!r}.")
    s = _prepare(scores, lengths, per_token)
    n = s.shape[0]
    matched, marginal = _matched(s), _marginal(s)
    return {
        "mi": (matched - marginal).mean().item(),
        "mi_upper_bound": math.log(n),
        "retrieval_acc": _retrieval(s, ties).mean().item(),
        "retrieval_chance": 1.0 / n,
        "cond_entropy": -matched.mean().item(),
        "marginal_entropy": -marginal.mean().item(),
    }


def _perm_gaps(s: torch.Tensor, n_perm: int, seed: int) -> torch.Tensor:
    """[N, K, N] -> [n_perm]: mi - mi_permuted for seeded random prompt relabellings.

    The marginal is the same under every relabelling, so it cancels; differencing the matched
    terms directly makes the gap exactly 0 when scores do not depend on the prompt."""
    if int(n_perm) != n_perm or n_perm < 1:
        raise ValueError(f"n_perm must be a positive integer; got {n_perm!r}.")
    n_perm = int(n_perm)
    n, k, _ = s.shape
    gen = torch.Generator().manual_seed(int(seed))
    perms = torch.stack([torch.randperm(n, generator=gen) for _ in range(n_perm)]).to(s.device)
    rows = torch.arange(n, device=s.device)[None, :, None]
    cols = torch.arange(k, device=s.device)[None, None, :]
    permuted = s[rows, cols, perms[:, :, None]]                         # [n_perm, N, K]
    return (_matched(s).unsqueeze(0) - permuted).mean(dim=(1, 2))


def permutation_null(scores, *, n_perm: int, seed: int, lengths=None,
                     per_token: bool = False) -> torch.Tensor:
    """MI recomputed with prompt labels permuted: a sample from its null distribution.

    For each of ``n_perm`` uniform random permutations pi (a ``torch.Generator`` seeded with
    ``seed``, so the result is deterministic), ``scores[i, k, pi(i)]`` plays the matched term,
    i.e. the reasonings of prompt i are credited to prompt pi(i); the marginal is unchanged.
    If the reasonings do not depend on the prompt (X and Z independent), which prompt a group of
    reasonings came from is an arbitrary label: the true matching is exchangeable with any
    relabelling, so the observed MI is just one more draw from this distribution. A permutation
    acts on whole groups, keeping the K samples of a prompt together, so within-group dependence
    is preserved. The identity may be drawn (the exact permutation distribution).

    Args:
        scores: [N, K, N] cross-scores, as in :func:`mi_from_scores`.
        n_perm: number of permutations (>= 1).
        seed: generator seed.
        lengths, per_token: as in :func:`mi_from_scores`.

    Returns:
        float64 tensor [n_perm] of permuted MI values.
    """
    s = _prepare(scores, lengths, per_token)
    mi = (_matched(s) - _marginal(s)).mean()
    return mi - _perm_gaps(s, n_perm, seed)


def mi_zscore(scores, *, n_perm: int = 32, seed: int = 0, lengths=None, per_token: bool = False,
              std_floor: float = 1e-8) -> dict[str, float]:
    """MI standardised against the permutation null (:func:`permutation_null`).

    ``zscore = (mi - null_mean) / max(null_std, std_floor)`` with ``null_std`` the sample std
    (ddof = 1, so ``n_perm >= 2``). A degenerate null (std below ``std_floor``, e.g. scores that
    ignore the prompt, or N = 2 with only identity draws) gives exactly 0.0 when mi equals the
    null, and a large finite value of the right sign otherwise; never NaN or inf. When scores
    barely depend on the prompt the null's spread is float rounding noise, and z is then just one
    more null draw, which is what it should be.

    Args:
        scores: [N, K, N] cross-scores. lengths, per_token: as in :func:`mi_from_scores`.
        n_perm, seed: as in :func:`permutation_null`.
        std_floor: smallest denominator.

    Returns:
        ``mi``, ``null_mean``, ``null_std``, ``zscore`` (floats).
    """
    if int(n_perm) != n_perm or n_perm < 2:
        raise ValueError(f"mi_zscore needs n_perm >= 2 to estimate the null's spread; got {n_perm!r}.")
    s = _prepare(scores, lengths, per_token)
    mi = (_matched(s) - _marginal(s)).mean().item()
    gaps = _perm_gaps(s, n_perm, seed)
    gap_mean, null_std = gaps.mean().item(), gaps.std().item()
    return {
        "mi": mi,
        "null_mean": mi - gap_mean,
        "null_std": null_std,
        "zscore": gap_mean / max(null_std, std_floor),
    }


def ema_update(prev: float | None, value: float, *, decay: float = 0.9) -> float | None:
    """Exponential moving average step: ``decay * prev + (1 - decay) * value``.

    ``prev`` None starts the average at ``value``. A NaN or inf ``value`` (e.g. a skipped
    measurement) returns ``prev`` unchanged, since it would otherwise poison every later value.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1]; got {decay}.")
    value = float(value)
    if not math.isfinite(value):
        return prev
    if prev is None:
        return value
    return decay * float(prev) + (1.0 - decay) * value


def collapse_metrics(scores, *, lengths, n_perm: int, seed: int,
                     ties: str = "split") -> dict[str, float]:
    """Everything logged for one cross-scored batch.

    Args:
        scores: [N, K, N] sequence log-likelihoods. lengths: [N, K] reasoning lengths in tokens.
        n_perm, seed: permutation null, as in :func:`mi_zscore`. ties: as in :func:`mi_from_scores`.

    Returns:
        ``mi``, ``mi_upper_bound``, ``mi_zscore``, ``retrieval_acc``, ``retrieval_chance``,
        ``cond_entropy``, ``marginal_entropy`` from per-sequence sums; ``mi_per_token``,
        ``mi_zscore_per_token``, ``cond_entropy_per_token``, ``marginal_entropy_per_token`` from
        length-normalised scores. Retrieval is the same either way (a positive per-row scale
        does not move the argmax).
    """
    seq = mi_from_scores(scores, lengths=lengths, ties=ties)
    tok = mi_from_scores(scores, lengths=lengths, per_token=True, ties=ties)
    z_seq = mi_zscore(scores, n_perm=n_perm, seed=seed, lengths=lengths)
    z_tok = mi_zscore(scores, n_perm=n_perm, seed=seed, lengths=lengths, per_token=True)
    return {
        "mi": seq["mi"],
        "mi_per_token": tok["mi"],
        "mi_upper_bound": seq["mi_upper_bound"],
        "mi_zscore": z_seq["zscore"],
        "mi_zscore_per_token": z_tok["zscore"],
        "retrieval_acc": seq["retrieval_acc"],
        "retrieval_chance": seq["retrieval_chance"],
        "cond_entropy": seq["cond_entropy"],
        "marginal_entropy": seq["marginal_entropy"],
        "cond_entropy_per_token": tok["cond_entropy"],
        "marginal_entropy_per_token": tok["marginal_entropy"],
    }
