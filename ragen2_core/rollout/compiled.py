"""`rollout.compile`: decode on transformers' static cache with a compiled decode step.

A decode step of a small model at small batch is a few hundred tiny kernels; launching them from
Python costs more than running them on a GPU. Compiled (torch.compile; on CUDA with CUDA graphs,
``mode="reduce-overhead"``), one step is one graph replay. That needs fixed shapes and fixed
addresses, so this session keeps the cache in a transformers ``StaticCache`` of fixed rows and
columns:

* rows: the batch's rows at the first turn stay in the cache for the whole rollout; an episode
  that ends leaves a dead row (fed masked pads) instead of being dropped, and sampling draws for
  the live rows only, so the random stream is the default session's;
* columns: a multiple of `COLUMN_BUCKET` that fits the first turn and its replies; when a later turn
  does not fit, the cache moves to the next bucket (one more compile for that size);
* the first turn's prefill (one encoding per distinct prompt) runs as in `KVSession`, on a dynamic
  cache that is then copied into the static one; later prefills run eagerly on the static cache.

Attention then runs over every column of the static cache, the unused ones masked out, and the
compiler fuses ops: logits agree with the default session to float rounding, not
bit for bit, so a sampled token can differ where a draw falls within that rounding of the boundary
between two tokens (tests/unit/test_compiled_rollout.py compares them).

    session = StaticKVSession(model, tok.pad_token_id)            # what rollout.compile: true uses
    batch = rollout(model, tok, make_env, ..., session=session)
"""
from __future__ import annotations

import torch
from transformers import StaticCache

from ragen2_core.rollout.sampler import KVSession, cache_kwarg, takes_bool_4d_mask

COLUMN_BUCKET = 256   # static cache widths are multiples of this: few sizes, so few compiles

# (model, rows, columns, backend) -> Decoder: a compiled step is reused by every later session of
# that shape (a training run rolls out once per step) instead of compiling again. Only the latest
# model's are kept, so a process that trains one model after another does not hold the old ones.
_DECODERS: dict[tuple, "Decoder"] = {}


def bucket(n: int) -> int:
    return -(-n // COLUMN_BUCKET) * COLUMN_BUCKET


class Decoder:
    """A static cache of [rows, columns] and the compiled decode step that writes into it."""

    def __init__(self, model, rows: int, columns: int, backend: str | None):
        self.model, self.rows, self.columns = model, rows, columns
        self.cache = StaticCache(config=model.config, max_cache_len=columns)
        self.cuda = next(model.parameters()).device.type == "cuda"
        arg = cache_kwarg(model)
        cache = self.cache

        def step(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                        **{arg: cache})
            return out.logits[:, -1, :]

        self.step_fn = torch.compile(step, backend=backend or "inductor", dynamic=False,
                                     mode="reduce-overhead" if self.cuda and not backend else None)

    def step(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's output is consumed
        return self.step_fn(ids, pos, mask).clone()

    def load(self, layers: list[tuple[torch.Tensor, torch.Tensor]], used: int) -> None:
        """Fill columns [0, used) from per-layer (keys, values) [rows, heads, >= used, dim]."""
        for layer, (k, v) in zip(self.cache.layers, layers):
            if not layer.is_initialized:
                layer.lazy_initialization(k[:, :, :1], v[:, :, :1])
            layer.keys[:, :, :used].copy_(k[:, :, :used])
            layer.values[:, :, :used].copy_(v[:, :, :used])
            layer.cumulative_length.fill_(used)


def decoder(model, rows: int, columns: int, backend: str | None) -> Decoder:
    for key in [k for k, d in _DECODERS.items() if d.model is not model]:
        del _DECODERS[key]
    key = (id(model), rows, columns, backend)
    if key not in _DECODERS:
        _DECODERS[key] = Decoder(model, rows, columns, backend)
    return _DECODERS[key]


class StaticKVSession(KVSession):
    """`KVSession` on a static cache with a compiled decode step (see the module docstring).
    ``backend`` is torch.compile's (default inductor; "eager" checks the static cache alone)."""

    def __init__(self, model, pad_id: int, *, stop_every: int | None = None, backend: str | None = None):
        super().__init__(model, pad_id, stop_every=stop_every)
        if not takes_bool_4d_mask(model):
            raise ValueError("rollout.compile needs a model with SDPA attention and full attention in every layer "
                             f"(this one: {getattr(model.config, '_attn_implementation', None)}); "
                             "set rollout.compile: false")
        self.backend = backend
        self.dec: Decoder | None = None
        self.phys: torch.Tensor | None = None   # [R] cache row of each live episode, in episode order
        self.used = 0                           # columns written
        self.headroom = 0                       # the turn's reply budget: room kept for it

    def turn(self, chunks: list[list[int]], p, stop_ids: torch.Tensor, generator) -> list[list[int]]:
        self.headroom = p.max_new_tokens
        return super().turn(chunks, p, stop_ids, generator)

    # ------------------------------------------------------------------ cache layout
    def columns(self) -> int:
        return self.used if self.dec is not None else super().columns()

    def prefill(self, chunks: list[list[int]]) -> torch.Tensor:
        first = self.next_pos is None
        logits = super().prefill(chunks)
        if first:
            self._to_static()
        return logits

    def _to_static(self) -> None:
        """Move the first turn's dynamic cache into a static one; its rows become the fixed rows."""
        past = super().columns()
        layers = [(layer.keys, layer.values) for layer in self.cache.layers]
        self._move(decoder(self.model, len(self.next_pos), bucket(past + self.headroom), self.backend), layers, past,
                   self.mask)
        self.phys = torch.arange(self.dec.rows, device=self.device)

    def _fit(self, n: int) -> None:
        """Make room for n columns, moving to a wider static cache when needed."""
        if n <= self.dec.columns:
            return
        layers = [(layer.keys, layer.values) for layer in self.dec.cache.layers]
        self._move(decoder(self.model, self.dec.rows, bucket(n), self.backend), layers, self.used,
                   self.mask[:, :self.used])

    def _move(self, dec: Decoder, layers, used: int, mask: torch.Tensor) -> None:
        dec.load(layers, used)
        self.dec, self.cache, self.used = dec, dec.cache, used
        self.mask = torch.zeros(dec.rows, dec.columns, dtype=torch.bool, device=self.device)
        self.mask[:, :used] = mask

    def _cut(self, n: int) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(n)
        self.mask[:, n:] = False
        self.used = n

    def _reserve(self, n: int) -> None:
        self._fit(self.used + n)

    # ------------------------------------------------------------------ rows
    def _spread(self, x: torch.Tensor, fill) -> torch.Tensor:
        """Per-episode rows [R, ...] -> per cache row [rows, ...]; dead rows get `fill`."""
        out = torch.full((self.dec.rows, *x.shape[1:]), fill, dtype=x.dtype, device=self.device)
        return out.index_copy(0, self.phys, x)

    def keep(self, rows: list[int]) -> None:
        if self.dec is None:
            return super().keep(rows)
        if len(set(rows)) < len(rows):
            raise ValueError("StaticKVSession.keep: rows can be dropped, not copied, after the first turn")
        self.phys = self.phys[torch.tensor(rows, dtype=torch.long, device=self.device)]
        self.pending = [self.pending[r] for r in rows] if self.pending else []

    # ------------------------------------------------------------------ forwards
    def _forward(self, ids: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
        if self.dec is None:
            return super()._forward(ids, chunk_mask)
        A = ids.shape[1]
        self._fit(self.used + A + self.headroom)
        ids, chunk_mask = self._spread(ids, self.pad_id), self._spread(chunk_mask, 0)
        pos = (self.next_pos[:, None] + chunk_mask.cumsum(-1) - 1).clamp(min=0)
        self.mask[:, self.used:self.used + A] = chunk_mask.bool()
        cols = torch.arange(self.dec.columns, device=self.device)
        causal = cols[None, :] <= (self.used + torch.arange(A, device=self.device))[:, None]      # [A, columns]
        out = self.model(input_ids=ids, attention_mask=self.mask[:, None, None, :] & causal[None, None],
                         position_ids=pos, use_cache=True, logits_to_keep=1, **{self.cache_arg: self.cache})
        self.used += A
        self.next_pos = self.next_pos + chunk_mask.sum(-1)
        return out.logits[:, -1, :][self.phys]

    def _step(self, tok: torch.Tensor, live: torch.Tensor, col: int, cache_pos: torch.Tensor) -> torch.Tensor:
        live = self._spread(live, False)
        self.mask[:, col] = live
        self.next_pos = self.next_pos + live
        logits = self.dec.step(self._spread(tok, self.pad_id)[:, None], (self.next_pos - 1)[:, None],
                               self.mask[:, None, None, :])
        self.used = col + 1
        return logits[self.phys]
