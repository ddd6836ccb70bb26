"""Template-collapse metrics: mutual information between prompts and reasonings (in nats).

In-batch cross-scoring (REFERENCE.md section 2). Each reasoning z_{i,k} (the k-th sample for
prompt i) is teacher-forced under every prompt x_j of the batch:

    scores[i, k, j] = log p(z_{i,k} | x_j)                      shape [N, K, N]
    matched  = scores[i, k, i]
    marginal = logsumexp_j scores[i, k, j] - log N              (uniform over the batch's prompts)
    MI       = mean(matched - marginal)                         <= log N

Template collapse is MI -> 0 while the conditional entropy -mean(matched) stays high: the
reasonings stay diverse but stop depending on the prompt.

Two z-scores standardise the MI, and they answer different questions:

* ``mi_zscore`` (the RAGEN-2 release's statistic, `ragen/trainer/collapse_metrics.py`, the one whose
  Spearman correlation with success the paper reports): per-token by default,
  ``mean_s[(matched_s - marginal_s) / (std(marginal) + 1e-3)]`` over the scored samples s, std the
  population std of the marginals; ``mi_zscore_ema`` divides the same mean by an EMA of that std.
  An effect size: how far matched stands above the mixture, in units of how much reasonings differ
  in likelihood. It has no null calibration, so a threshold on it is a choice, not a test.
* ``mi_perm_zscore`` (ragen2's): MI against a permutation null that relabels which prompt each group
  of reasonings came from. About N(0, 1) when reasonings ignore their prompt, whatever the scale of
  the scores, so "below 2" means "no detectable dependence": the calibrated alarm.

Usage::

    import torch
    from ragen2_core.metrics.collapse import collapse_metrics, ema_update

    scores = torch.randn(8, 4, 8)                 # [N prompts, K samples, N prompts]
    lengths = torch.randint(1, 50, (8, 4))        # reasoning lengths in tokens, [N, K]
    m = collapse_metrics(scores, lengths=lengths, n_perm=32, seed=0, ema=None, ema_decay=0.9)
    m["mi_zscore"], m["mi_zscore_ema"], m["mi_perm_zscore"], m["mi_perm_zscore_ema"]
    ema = ema_state(m)                            # carry to the next measurement
"""
from __future__ import annotations

import math

import torch

TIE_RULES = ("split", "strict", "first")
STD_EPS = 1e-3  # the release's `std_eps` in the marginal-std denominators


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


def release_zscores(scores, *, lengths, std_eps: float = STD_EPS) -> dict[str, float]:
    """The release's MI z-scores and marginal stds, per token and per sequence.

    Over the samples s with a non-empty reasoning, under the prompts of the groups that have one
    (the release keeps only those pairs, so a group whose reasonings are all empty is no column of the
    marginal either: N' <= N prompts, marginal = logsumexp over them - log N'):
        mi_zscore      = mean_s[(matched_s - marginal_s) / (std(marginal) + std_eps)]   per-token scores
        mi_zscore_seq  = the same on sequence sums
        marginal_std, marginal_std_seq = std(marginal), population (ddof 0)
    Since the denominator is one number, mi_zscore = (mean gap) / (std + eps); ``mi_gap`` and
    ``mi_gap_seq`` (those mean gaps: the MI over the non-empty samples) are returned for the EMA form.

    Args:
        scores: [N, K, N] sequence log-likelihoods; lengths: [N, K] reasoning lengths in tokens.

    Returns:
        floats; NaN when fewer than two prompts have a reasoning (the release then logs nothing).
    """
    out = {}
    nonempty = torch.as_tensor(lengths) > 0                           # [N, K]
    cols = nonempty.any(dim=1)                                        # prompts that keep a column
    valid = nonempty[cols].reshape(-1)
    for suffix, per_token in (("", True), ("_seq", False)):
        s = _prepare(scores, lengths, per_token)[cols][:, :, cols]
        if int(cols.sum()) < 2:
            out |= {f"mi_zscore{suffix}": math.nan, f"marginal_std{suffix}": math.nan, f"mi_gap{suffix}": math.nan}
            continue
        gap = (_matched(s) - _marginal(s)).reshape(-1)[valid]
        marginal = _marginal(s).reshape(-1)[valid]
        std = marginal.std(unbiased=False).item() if marginal.numel() > 1 else 0.0
        out |= {f"mi_zscore{suffix}": gap.mean().item() / (std + std_eps), f"marginal_std{suffix}": std,
                f"mi_gap{suffix}": gap.mean().item()}
    return out


def ema_state(metrics: dict) -> dict[str, float]:
    """The running EMAs of a measurement's metrics, to pass as ``ema`` to the next `collapse_metrics`
    (an EMA that has not started yet, NaN in the metrics, is None here)."""
    return {k: (None if math.isnan(metrics[k]) else metrics[k])
            for k in ("marginal_std_ema", "marginal_std_ema_seq", "mi_perm_zscore_ema")}


def collapse_metrics(scores, *, lengths, n_perm: int, seed: int, ema: dict | None = None,
                     ema_decay: float = 0.9, ties: str = "split") -> dict[str, float]:
    """Everything logged for one cross-scored batch.

    Args:
        scores: [N, K, N] sequence log-likelihoods. lengths: [N, K] reasoning lengths in tokens.
        n_perm, seed: permutation null, as in :func:`mi_zscore`. ties: as in :func:`mi_from_scores`.
        ema: the previous measurement's `ema_state`, or None at the first; ema_decay: their decay.

    Returns:
        ``mi``, ``mi_upper_bound``, ``retrieval_acc``, ``retrieval_chance``, ``cond_entropy``,
        ``marginal_entropy`` from per-sequence sums; ``mi_per_token``, ``cond_entropy_per_token``,
        ``marginal_entropy_per_token`` from length-normalised scores (retrieval is the same either
        way: a positive per-row scale does not move the argmax). The release's statistics
        (`release_zscores`): ``mi_zscore``, ``mi_zscore_seq``, ``marginal_std``, ``marginal_std_seq``,
        and ``marginal_std_ema``, ``marginal_std_ema_seq`` (EMA started at the first value),
        ``mi_zscore_ema`` = mi_gap / (marginal_std_ema + 1e-3), ``mi_zscore_ema_seq``. The permutation
        z-scores ``mi_perm_zscore`` (sequence sums), ``mi_perm_zscore_per_token`` and
        ``mi_perm_zscore_ema`` (EMA of ``mi_perm_zscore``).
    """
    seq = mi_from_scores(scores, lengths=lengths, ties=ties)
    tok = mi_from_scores(scores, lengths=lengths, per_token=True, ties=ties)
    z_seq = mi_zscore(scores, n_perm=n_perm, seed=seed, lengths=lengths)
    z_tok = mi_zscore(scores, n_perm=n_perm, seed=seed, lengths=lengths, per_token=True)
    rel = release_zscores(scores, lengths=lengths)
    ema = ema or {}
    std_ema = ema_update(ema.get("marginal_std_ema"), rel["marginal_std"], decay=ema_decay)
    std_ema_seq = ema_update(ema.get("marginal_std_ema_seq"), rel["marginal_std_seq"], decay=ema_decay)
    nan_if_none = lambda x: math.nan if x is None else x  # noqa: E731
    return {
        "mi": seq["mi"],
        "mi_per_token": tok["mi"],
        "mi_upper_bound": seq["mi_upper_bound"],
        "retrieval_acc": seq["retrieval_acc"],
        "retrieval_chance": seq["retrieval_chance"],
        "cond_entropy": seq["cond_entropy"],
        "marginal_entropy": seq["marginal_entropy"],
        "cond_entropy_per_token": tok["cond_entropy"],
        "marginal_entropy_per_token": tok["marginal_entropy"],
        "mi_zscore": rel["mi_zscore"],
        "mi_zscore_seq": rel["mi_zscore_seq"],
        "marginal_std": rel["marginal_std"],
        "marginal_std_seq": rel["marginal_std_seq"],
        "marginal_std_ema": nan_if_none(std_ema),
        "marginal_std_ema_seq": nan_if_none(std_ema_seq),
        "mi_zscore_ema": rel["mi_gap"] / (std_ema + STD_EPS) if std_ema is not None else math.nan,
        "mi_zscore_ema_seq": rel["mi_gap_seq"] / (std_ema_seq + STD_EPS) if std_ema_seq is not None else math.nan,
        "mi_perm_zscore": z_seq["zscore"],
        "mi_perm_zscore_per_token": z_tok["zscore"],
        "mi_perm_zscore_ema": nan_if_none(ema_update(ema.get("mi_perm_zscore_ema"), z_seq["zscore"], decay=ema_decay)),
    }
