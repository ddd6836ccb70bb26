"""Training forward that encodes each group's shared first prompt once.

The rollouts of one group start from the same first chunk (system text + first state, ending with
``<think>``), and that chunk is most of an episode's tokens: on FrozenLake ~200 prompt tokens against
~20 reply tokens per turn. A plain forward/backward pays for it once per row; here each distinct
prompt of a micro-batch is run once, its KV cache is indexed out to the rows that share it (indexing
is differentiable: the backward sums the rows' gradients into the one prompt), and only the rest of
each row is fed on top. The logits equal the plain forward's up to float rounding (tested), so the
loss and gradients do too.

    logits, start = forward_window(actor.forward, ids, attn, prefix_len=prefix_len)  # [R, W, V], [R]
    mask_w = window(mask, start, logits.shape[1])     # any [R, L-1] per-token tensor, aligned to logits
    order = micro_batch_order(lengths, group_ids)     # row order that keeps sharers together

Only positions from the prompt's last token on are computed: the ones before predict prompt tokens,
which are never trained on (the response mask is 0 there). The PPO critic goes through the same
path (its `.logits` are the values, [R, W, 1]): GAE reads values at reply positions only.

With ``logit_chunk > 0`` the model's output head is left out of its forward and the result is a
`HeadLogits` (hidden states + head weight) that `algo.losses` turns into log-probs and entropies
chunk by chunk: the same values and gradients without a [R, W, V] float32 tensor. Models whose
logits are not just ``lm_head(final hidden)`` (soft-capping, scaling), a head with a bias or LoRA
on it, and ZeRO-3-partitioned weights keep the full logits.
"""
from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from ragen2_core.algo.losses import HeadLogits
from ragen2_core.rollout.engine import cache_kwarg

# Architectures whose forward ends in ``logits = lm_head(final_norm(h))`` with nothing after it.
PLAIN_HEAD_TYPES = ("qwen2", "qwen3", "llama", "mistral")


def _model(forward) -> torch.nn.Module:
    """The model behind `forward`: a model, or a bound method of an engine that holds it as `.module`."""
    if isinstance(forward, torch.nn.Module):
        return forward
    owner = forward.__self__
    return getattr(owner, "module", owner)


def _cache_arg(forward) -> str:
    return cache_kwarg(_model(forward))


def _plain_head(model: torch.nn.Module):
    """(parent module, attribute name, head) when logits are exactly ``head(hidden)`` and the head
    can be applied chunk by chunk outside the forward; None otherwise."""
    config = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if (getattr(config, "model_type", None) not in PLAIN_HEAD_TYPES or type(head) is not torch.nn.Linear
            or head.bias is not None or hasattr(head.weight, "ds_id")):
        return None
    name = next((n for n, m in model.named_modules() if m is head), None)
    if name is None:
        return None
    parent, _, attr = name.rpartition(".")
    return model.get_submodule(parent), attr, head


@contextlib.contextmanager
def _hidden_out(model: torch.nn.Module, found):
    """The model's forward returns the head's input as `.logits` while inside."""
    parent, attr, head = found
    setattr(parent, attr, torch.nn.Identity())
    try:
        yield
    finally:
        setattr(parent, attr, head)


def forward_window(forward, ids: torch.Tensor, attn: torch.Tensor, *, prefix_len: torch.Tensor | None = None,
                   cache_arg: str | None = None, logit_chunk: int = 0) -> tuple[torch.Tensor | HeadLogits, torch.Tensor]:
    """`_forward_window`'s logits, as `HeadLogits` evaluated `logit_chunk` positions at a time when
    that is > 0 and the model allows it (see the module docstring), else as a float tensor."""
    found = _plain_head(_model(forward)) if logit_chunk > 0 else None
    if found is None:
        logits, start = _forward_window(forward, ids, attn, prefix_len=prefix_len, cache_arg=cache_arg, cast=True)
        return logits, start
    with _hidden_out(_model(forward), found):
        hidden, start = _forward_window(forward, ids, attn, prefix_len=prefix_len, cache_arg=cache_arg, cast=False)
    return HeadLogits(hidden, found[2].weight, logit_chunk), start


def _forward_window(forward, ids: torch.Tensor, attn: torch.Tensor, *, prefix_len: torch.Tensor | None,
                    cache_arg: str | None, cast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits for the positions that can be trained on, and where they start.

    Args:
        forward: a model, or an engine's forward (called with HF keyword arguments).
        ids, attn: [R, L] right-padded token ids and attention mask.
        prefix_len: [R] length of each row's shared first prompt, or None for one plain forward.
            Rows whose first `prefix_len` tokens are identical share one prompt encoding.

    Returns:
        (logits [R, W, V] float, start [R] long): ``logits[r, j]`` predicts token ``start[r] + j + 1``,
        i.e. sits at next-token position ``start[r] + j``. Without sharing, start = 0 and W = L - 1;
        with it, start = prefix_len - 1 and W = the longest continuation, so the loss never touches
        the prompt positions (most of the sequence, and never trained on).
    """
    R, L = ids.shape
    device = ids.device
    f32 = (lambda x: x.float()) if cast else (lambda x: x)  # noqa: E731  hidden states keep their dtype
    plain = lambda: (f32(forward(input_ids=ids, attention_mask=attn).logits[:, :-1]),  # noqa: E731
                     torch.zeros(R, dtype=torch.long, device=device))
    if prefix_len is None:
        return plain()
    p = prefix_len.tolist()
    keys = [tuple(ids[r, :p[r]].tolist()) for r in range(R)]
    uniq = list(dict.fromkeys(keys))
    if len(uniq) == R:   # nothing shared: one plain forward is cheaper than two
        return plain()
    owner = torch.tensor([uniq.index(k) for k in keys], device=device)      # [R] prompt of each row

    # Prompts, left-padded so they all end at the same cache column.
    P = max(len(k) for k in uniq)
    pre_ids = torch.zeros(len(uniq), P, dtype=torch.long, device=device)
    pre_mask = torch.zeros(len(uniq), P, dtype=torch.long, device=device)
    for u, k in enumerate(uniq):
        pre_ids[u, P - len(k):] = torch.tensor(k, device=device)
        pre_mask[u, P - len(k):] = 1
    pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
    arg = cache_arg or _cache_arg(forward)
    # The cache is handed in and filled in place: a head that returns no cache (the critic's token
    # classifier) shares its prompts the same way as a causal LM.
    cache = DynamicCache()
    out = forward(input_ids=pre_ids, attention_mask=pre_mask, position_ids=pre_pos, use_cache=True, **{arg: cache})
    last = f32(out.logits[:, -1])                                            # [U, V] predicts token p
    cache.batch_select_indices(owner)                                        # [U] -> [R] rows

    # The rest of each row, right-padded, at positions p .. L_r - 1.
    n = (attn.sum(-1) - prefix_len).clamp(min=0)                             # [R] continuation tokens
    C = max(int(n.max()), 1)
    cont_ids = torch.zeros(R, C, dtype=torch.long, device=device)
    cont_mask = torch.zeros(R, C, dtype=torch.long, device=device)
    for r in range(R):
        cont_ids[r, :n[r]] = ids[r, p[r]:p[r] + int(n[r])]
        cont_mask[r, :n[r]] = 1
    pos = prefix_len[:, None] + torch.arange(C, device=device)[None]
    cont = forward(input_ids=cont_ids, attention_mask=torch.cat([pre_mask[owner], cont_mask], dim=1),
                   position_ids=pos, use_cache=True, **{arg: cache},
                   cache_position=torch.arange(P, P + C, device=device)).logits
    cont = f32(cont)                                                          # [R, C, V]
    # The prompt's last position predicts token p; continuation position j predicts token p + j + 1.
    return torch.cat([last[owner][:, None], cont[:, :C - 1]], dim=1), prefix_len - 1


def window(x: torch.Tensor, start: torch.Tensor, width: int) -> torch.Tensor:
    """[R, T] per-position values -> [R, width] at positions start[r] .. start[r] + width - 1
    (zero past the end of x)."""
    idx = start[:, None] + torch.arange(width, device=x.device)[None]
    valid = idx < x.shape[1]
    out = x.gather(1, idx.clamp(max=x.shape[1] - 1))
    return out * valid if out.dtype != torch.bool else out & valid


def unwindow(values: torch.Tensor, start: torch.Tensor, length: int) -> torch.Tensor:
    """Inverse of `window`: [R, W] -> [R, length], zero outside each row's window."""
    R, W = values.shape
    idx = start[:, None] + torch.arange(W, device=values.device)[None]
    keep = idx < length
    rows = torch.arange(R, device=values.device)[:, None].expand(R, W)
    return values.new_zeros(R, length).index_put((rows[keep], idx[keep]), values[keep])


def micro_batch_order(lengths: torch.Tensor, group_ids: torch.Tensor | None) -> torch.Tensor:
    """Row order for cutting micro-batches: by length (so each is cut to little padding) and, when
    prompts are shared, group by group (groups ordered by their longest row), so the rows that share
    a prompt land in the same micro-batch."""
    if group_ids is None:
        return torch.argsort(lengths, stable=True)
    group_max = torch.zeros(int(group_ids.max()) + 1, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, group_ids, lengths, reduce="amax")
    key = (group_max[group_ids] * (int(group_ids.max()) + 1) + group_ids) * (int(lengths.max()) + 1) + lengths
    return torch.argsort(key, stable=True)
