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

What the shared path needs to know about the rows (their lengths, prompt lengths and which rows
share a prompt) is read back from the device unless the caller hands it over as a `RowPlan` made on
the host: on a GPU each read makes the host wait for the device, once per micro-batch.

    plan = RowPlan(lengths=[...], prefix_len=[...], prompt=[...])   # rows with equal `prompt` share it
    logits, start = forward_window(actor.forward, ids, attn, prefix_len=prefix_len, plan=plan)

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
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from ragen2_core.algo.losses import HeadLogits
from ragen2_core.rollout.sampler import cache_kwarg, takes_bool_4d_mask

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


@dataclass(frozen=True)
class RowPlan:
    """Per row of a micro-batch: its token count, its shared prompt's length, and an id of that
    prompt (rows with equal ids hold the same prompt tokens)."""
    lengths: list[int]
    prefix_len: list[int]
    prompt: list


def read_plan(ids: torch.Tensor, attn: torch.Tensor, prefix_len: torch.Tensor) -> RowPlan:
    """The `RowPlan` of device tensors, read back (each read waits for the device)."""
    p = prefix_len.tolist()
    return RowPlan(lengths=attn.sum(-1).tolist(), prefix_len=p,
                   prompt=[tuple(ids[r, :p[r]].tolist()) for r in range(ids.shape[0])])


def upload(values: list[int], device: torch.device) -> torch.Tensor:
    """A small host list as a long tensor on `device`, copied without making the host wait for
    the device (a plain copy to a GPU waits for everything queued before it)."""
    t = torch.tensor(values, dtype=torch.long)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def forward_window(forward, ids: torch.Tensor, attn: torch.Tensor, *, prefix_len: torch.Tensor | None = None,
                   cache_arg: str | None = None, logit_chunk: int = 0,
                   plan: RowPlan | None = None) -> tuple[torch.Tensor | HeadLogits, torch.Tensor]:
    """`_forward_window`'s logits, as `HeadLogits` evaluated `logit_chunk` positions at a time when
    that is > 0 and the model allows it (see the module docstring), else as a float tensor."""
    found = _plain_head(_model(forward)) if logit_chunk > 0 else None
    kw = dict(prefix_len=prefix_len, cache_arg=cache_arg, plan=plan)
    if found is None:
        logits, start = _forward_window(forward, ids, attn, **kw, cast=True)
        return logits, start
    with _hidden_out(_model(forward), found):
        hidden, start = _forward_window(forward, ids, attn, **kw, cast=False)
    return HeadLogits(hidden, found[2].weight, logit_chunk), start


def _forward_window(forward, ids: torch.Tensor, attn: torch.Tensor, *, prefix_len: torch.Tensor | None,
                    cache_arg: str | None, cast: bool,
                    plan: RowPlan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits for the positions that can be trained on, and where they start.

    Args:
        forward: a model, or an engine's forward (called with HF keyword arguments).
        ids, attn: [R, L] right-padded token ids and attention mask.
        prefix_len: [R] length of each row's shared first prompt, or None for one plain forward.
            Rows whose first `prefix_len` tokens are identical share one prompt encoding.
        plan: the rows' `RowPlan` when the caller knows it (else it is read from the tensors).

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
    plan = plan or read_plan(ids, attn, prefix_len)
    uniq = list(dict.fromkeys(plan.prompt))
    if len(uniq) == R:   # nothing shared: one plain forward is cheaper than two
        return plain()
    owner = upload([uniq.index(k) for k in plan.prompt], device)             # [R] prompt of each row
    holder = [plan.prompt.index(k) for k in uniq]                            # a row holding each prompt

    # Prompts, left-padded so they all end at the same cache column.
    P = max(plan.prefix_len[r] for r in holder)
    pre_ids = torch.zeros(len(uniq), P, dtype=torch.long, device=device)
    pre_mask = torch.zeros(len(uniq), P, dtype=torch.long, device=device)
    for u, r in enumerate(holder):
        k = plan.prefix_len[r]
        pre_ids[u, P - k:] = ids[r, :k]
        pre_mask[u, P - k:] = 1
    pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
    arg = cache_arg or _cache_arg(forward)
    # The cache is handed in and filled in place: a head that returns no cache (the critic's token
    # classifier) shares its prompts the same way as a causal LM.
    cache = DynamicCache()
    out = forward(input_ids=pre_ids, attention_mask=_prompt_mask(_model(forward), pre_mask, plan, holder),
                  position_ids=pre_pos, use_cache=True, **{arg: cache})
    last = f32(out.logits[:, -1])                                            # [U, V] predicts token p
    cache.batch_select_indices(owner)                                        # [U] -> [R] rows

    # The rest of each row, right-padded, at positions p .. L_r - 1 (zeros past its end).
    n = [max(length - k, 0) for length, k in zip(plan.lengths, plan.prefix_len)]  # continuation tokens
    C = max(max(n), 1)
    cols = torch.arange(C, device=device)
    cont_mask = (cols[None] < upload(n, device)[:, None]).long()
    cont_ids = ids.gather(1, (prefix_len[:, None] + cols[None]).clamp(max=L - 1)) * cont_mask
    pos = prefix_len[:, None] + cols[None]
    cont = forward(input_ids=cont_ids, attention_mask=torch.cat([pre_mask[owner], cont_mask], dim=1),
                   position_ids=pos, use_cache=True, **{arg: cache},
                   cache_position=torch.arange(P, P + C, device=device)).logits
    cont = f32(cont)                                                          # [R, C, V]
    # The prompt's last position predicts token p; continuation position j predicts token p + j + 1.
    return torch.cat([last[owner][:, None], cont[:, :C - 1]], dim=1), prefix_len - 1


def _prompt_mask(model, pre_mask: torch.Tensor, plan: RowPlan, holder: list[int]):
    """The prompts' attention mask in a form transformers takes without reading it (on a GPU a read
    waits for the device): none when they all have one length, else the causal-and-padding mask it
    would build itself ([U, 1, P, P] bool) where the model's attention takes that, else the 2-D one."""
    if len({plan.prefix_len[r] for r in holder}) == 1:
        return None
    if not takes_bool_4d_mask(model):
        return pre_mask
    P = pre_mask.shape[1]
    causal = torch.ones(P, P, dtype=torch.bool, device=pre_mask.device).tril()
    return pre_mask.bool()[:, None, None, :] & causal[None, None]


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


def micro_batch_order(lengths, group_ids):
    """Row order for cutting micro-batches: by length (so each is cut to little padding) and, when
    prompts are shared, group by group (groups ordered by their longest row), so the rows that share
    a prompt land in the same micro-batch. Takes torch tensors or numpy arrays (a plan made on the
    host) and returns the same kind; tensors are read back once."""
    if isinstance(lengths, torch.Tensor):
        groups = None if group_ids is None else group_ids.cpu().numpy()
        return torch.from_numpy(micro_batch_order(lengths.cpu().numpy(), groups)).to(lengths.device)
    lengths = np.asarray(lengths, dtype=np.int64)
    if group_ids is None:
        return np.argsort(lengths, kind="stable")
    group_ids = np.asarray(group_ids, dtype=np.int64)
    group_max = np.zeros(int(group_ids.max()) + 1, dtype=np.int64)
    np.maximum.at(group_max, group_ids, lengths)
    key = (group_max[group_ids] * (int(group_ids.max()) + 1) + group_ids) * (int(lengths.max()) + 1) + lengths
    return np.argsort(key, kind="stable")
