"""In-batch cross-scoring for the template-collapse MI proxy (REFERENCE.md section 2).

Every sampled reasoning z_{i,k} is teacher-forced under every prompt x_j of the batch:

    scores[i, k, j] = log p(z_{i,k} | x_j) = sum_t log p(z_t | x_j, z_<t)       shape [N, K, N]

The prompt ("context") of a row is everything before its first reasoning token, i.e. the first chunk,
which ends with ``<think>``. N*K*N sequences look expensive, but the contexts are long (system text,
board, instructions) and the reasonings short, and all N*K reasonings share each context as a prefix.
So :func:`cross_score` encodes each context once, keeps its KV cache, and feeds only reasoning
tokens on top of copies of that cache, in micro-batches of at most ``token_budget`` rows x tokens:
N context forwards plus N * ceil(N*K*T / budget) short ones, instead of N*K*N forwards of the whole
context + reasoning (:func:`cross_score_naive`, kept as the ground truth for tests and benchmarks).

    scores, lengths, rows = score_batch(model, batch, n_prompts=8, k_samples=4,
                                        rng=np.random.default_rng(0))
    collapse_metrics(scores, lengths=lengths, n_perm=32, seed=0)
"""
from __future__ import annotations

import copy
import inspect

import numpy as np
import torch

from ragen2_core.rollout.sampler import cache_kwarg
from ragen2_core.batches import RolloutBatch

DEFAULT_TOKEN_BUDGET = 16384


def first_turn_reasonings(batch: RolloutBatch, rows: list[int], *, trajectory: bool = False
                          ) -> tuple[list[list[int]], list[list[int]]]:
    """(contexts, reasonings), one token list each per row in ``rows``.

    context = ``token_ids[b][:start]`` with (start, end) the first think span, so it ends with the
    ``<think>`` token; reasoning = the tokens strictly inside that span. With ``trajectory`` the
    reasoning is every turn's think-span tokens concatenated, still scored right after the first
    prompt: a proxy that asks how much the first state says about all the reasoning of the episode,
    skipping the env text between turns (which would otherwise dominate the score and is not the
    policy's choice). A row without a think span gets its first chunk as context and an empty
    reasoning (which scores 0).
    """
    contexts, reasonings = [], []
    for b in rows:
        ids, spans = batch.token_ids[b], batch.think_spans[b]
        if not spans:
            contexts.append(list(ids[:batch.prompt_len[b]]))
            reasonings.append([])
            continue
        contexts.append(list(ids[:spans[0][0]]))
        use = spans if trajectory else spans[:1]
        reasonings.append([t for s, e in use for t in ids[s:e]])
    return contexts, reasonings


def _keeps_logits(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [..., V], targets [...] -> log p(target) [...] in float32.

    gather - logsumexp instead of log_softmax: one [..., V] temporary fewer (the vocabulary of a
    real model makes that the largest tensor here)."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _check(contexts, reasonings, k: int) -> int:
    n = len(contexts)
    if k < 1 or len(reasonings) != n * k:
        raise ValueError(
            f"reasonings must be a flat list of N*K = {n}*{k} = {n * k} token lists in prompt-major "
            f"order (reasonings[i*K + k] sampled from contexts[i]); got {len(reasonings)} with k={k}.")
    empty = [j for j, c in enumerate(contexts) if not c]
    if empty:
        raise ValueError(
            f"contexts {empty} are empty; each context needs at least one token, since the first "
            f"reasoning token is predicted from the context's last position.")
    return n


def _micro_batches(reasonings: list[list[int]], token_budget: int) -> list[list[int]]:
    """Indices of the non-empty reasonings, longest first, cut so rows x longest <= token_budget
    (a single reasoning longer than the budget goes alone). Sorting keeps the padding small."""
    order = sorted((r for r, z in enumerate(reasonings) if z), key=lambda r: -len(reasonings[r]))
    chunks: list[list[int]] = []
    for r in order:
        if chunks and (len(chunks[-1]) + 1) * len(reasonings[chunks[-1][0]]) <= token_budget:
            chunks[-1].append(r)
        else:
            chunks.append([r])
    return chunks


@torch.no_grad()
def cross_score(model, contexts: list[list[int]], reasonings: list[list[int]], *, k: int,
                token_budget: int = DEFAULT_TOKEN_BUDGET) -> torch.Tensor:
    """Sequence log-likelihood of every reasoning under every context, with one cached context pass.

    Args:
        model: any HF causal LM (left in the train/eval mode it came in).
        contexts: N token lists; reasonings: N*K token lists, ``reasonings[i*K + k]`` from prompt i.
        k: K, samples per prompt. token_budget: max rows x padded reasoning length per forward.

    Returns:
        float64 [N, K, N], ``out[i, k, j] = sum_t log p(z_t | contexts[j], z_<t)`` for
        ``z = reasonings[i*K + k]``; an empty reasoning scores 0.
    """
    n = _check(contexts, reasonings, k)
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1 (rows x tokens per forward); got {token_budget}.")
    device = next(model.parameters()).device
    cache_arg, keep_kw = cache_kwarg(model), {"logits_to_keep": 1} if _keeps_logits(model) else {}
    chunks = _micro_batches(reasonings, token_budget)
    out = torch.zeros(n * k, n, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for j, ctx in enumerate(contexts):
            L = len(ctx)
            enc = model(input_ids=torch.tensor([ctx], device=device), use_cache=True, **keep_kw)
            cache = getattr(enc, cache_arg, None)
            first_logp = torch.log_softmax(enc.logits[0, -1].float(), dim=-1)          # [V]
            for rows in chunks:
                R, T = len(rows), len(reasonings[rows[0]])
                firsts = torch.tensor([reasonings[r][0] for r in rows], device=device)
                total = first_logp[firsts].double()                                    # [R]
                if T > 1:
                    # Feed z_<T-1 to predict z_1..z_T-1; z_0 came from the context's last logits.
                    ids = torch.zeros(R, T - 1, dtype=torch.long)
                    real = torch.zeros(R, T - 1, dtype=torch.long)
                    targets = torch.zeros(R, T - 1, dtype=torch.long)
                    for row, r in enumerate(rows):
                        z = reasonings[r]
                        ids[row, :len(z) - 1] = torch.tensor(z[:-1])
                        targets[row, :len(z) - 1] = torch.tensor(z[1:])
                        real[row, :len(z) - 1] = 1
                    ids, real, targets = ids.to(device), real.to(device), targets.to(device)
                    # A fresh copy per micro-batch: the forward appends to the cache it is given.
                    c = copy.deepcopy(cache)
                    c.batch_repeat_interleave(R)
                    mask = torch.cat([torch.ones(R, L, dtype=torch.long, device=device), real], dim=1)
                    pos = torch.arange(L, L + T - 1, device=device).expand(R, -1)
                    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                   use_cache=True, **{cache_arg: c}).logits
                    total = total + (_token_logps(logits, targets) * real).double().sum(-1)
                out[rows, j] = total.cpu()
    finally:
        model.train(was_training)
    return out.view(n, k, n)


@torch.no_grad()
def cross_score_naive(model, contexts: list[list[int]], reasonings: list[list[int]], *, k: int
                      ) -> torch.Tensor:
    """Same as :func:`cross_score`, one uncached forward of context + reasoning per pair (the ground
    truth; N*K*N forwards, each re-encoding the context)."""
    n = _check(contexts, reasonings, k)
    device = next(model.parameters()).device
    keep = _keeps_logits(model)
    out = torch.zeros(n * k, n, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for r, z in enumerate(reasonings):
            if not z:
                continue
            for j, ctx in enumerate(contexts):
                ids = torch.tensor([ctx + z], device=device)
                T = len(z)
                if keep:  # the lm head only where a reasoning token is predicted
                    logits = model(input_ids=ids, use_cache=False, logits_to_keep=T + 1).logits[0, :-1]
                else:
                    logits = model(input_ids=ids, use_cache=False).logits[0, len(ctx) - 1:-1]
                out[r, j] = _token_logps(logits, ids[0, len(ctx):]).double().sum().item()
    finally:
        model.train(was_training)
    return out.view(n, k, n)


def pick_rows(group_ids: list[int], *, n_prompts: int, k_samples: int, rng: np.random.Generator,
              prompt_keys: list | None = None) -> tuple[list[int], int, int]:
    """Choose N groups and K rows in each; returns (rows in prompt-major order, N, K).

    N = min(n_prompts, groups), K = min(k_samples, smallest chosen group). With ``prompt_keys``
    (one hashable per row, e.g. the context tokens) a group whose prompt repeats an earlier group's
    is never chosen: two groups can draw the same env seed, and two copies of one prompt would
    make the matched prompt indistinguishable from another, biasing MI and retrieval down.
    Deterministic given the state of ``rng``.
    """
    if n_prompts < 2:
        raise ValueError(f"n_prompts must be >= 2 (MI compares prompts); got {n_prompts}.")
    if k_samples < 1:
        raise ValueError(f"k_samples must be >= 1; got {k_samples}.")
    groups: dict[int, list[int]] = {}
    for b, g in enumerate(group_ids):
        groups.setdefault(g, []).append(b)
    seen, eligible = set(), []
    for g, rows in groups.items():
        key = None if prompt_keys is None else prompt_keys[rows[0]]
        if key is not None and key in seen:
            continue
        seen.add(key)
        eligible.append(rows)
    n = min(n_prompts, len(eligible))
    if n < 2:
        raise ValueError(
            f"cross-scoring needs at least 2 groups with distinct prompts; got {len(eligible)} "
            f"({len(groups)} groups in group_ids). Roll out more groups (rollout.n_groups >= 2) with "
            f"different env seeds, or turn the MI diagnostic off (collapse.every=0).")
    chosen = [eligible[i] for i in sorted(rng.choice(len(eligible), size=n, replace=False).tolist())]
    k = min(k_samples, min(len(rows) for rows in chosen))
    picked = []
    for rows in chosen:
        take = sorted(rng.choice(len(rows), size=k, replace=False).tolist()) if len(rows) > k else range(k)
        picked += [rows[t] for t in take]
    return picked, n, k


def score_batch(model, batch: RolloutBatch, *, n_prompts: int, k_samples: int,
                rng: np.random.Generator, trajectory: bool = False,
                token_budget: int = DEFAULT_TOKEN_BUDGET) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Cross-score N groups x K rows of a rollout batch (see :func:`pick_rows`).

    Returns:
        scores float64 [N, K, N] (:func:`cross_score`), lengths long [N, K] (reasoning tokens),
        rows_used: the N*K batch rows in prompt-major order (``rows_used[i*K + k]``).
    """
    all_contexts, _ = first_turn_reasonings(batch, list(range(len(batch))))
    keys = [tuple(c) for c in all_contexts]
    rows, n, k = pick_rows(batch.group_ids, n_prompts=n_prompts, k_samples=k_samples, rng=rng,
                           prompt_keys=keys)
    contexts, reasonings = first_turn_reasonings(batch, rows, trajectory=trajectory)
    scores = cross_score(model, contexts[::k], reasonings, k=k, token_budget=token_budget)
    lengths = torch.tensor([len(z) for z in reasonings], dtype=torch.long).view(n, k)
    return scores, lengths, rows
