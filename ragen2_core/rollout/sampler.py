"""The sampler: one KV cache kept across the turns of a batch of episodes, decoded in lock-step.

Per turn, one batched forward appends each live row's new text to the cache (``prefill``), then a
sampling loop generates every reply until each row has emitted a stop token or its budget
(``decode``). Rows that end are dropped between turns (``keep``). The history is never re-encoded:
that is where the speed over calling HF ``generate`` per turn comes from (benchmarks/rollout.py).

Rows have different lengths, so the cache is padded *inside*: each appended chunk is right-aligned
and its padding, like the tokens a row generated after it stopped, is masked out. Every row keeps
its own position counter, so a row sees exactly the positions it would see alone.

Decoding never waits for the device: sampled tokens stay there and are read once per turn, and
whether every row has stopped is read every ``stop_every`` steps (on a CPU, where such a read costs
nothing, every step). Steps run past the last row's stop are undone, so the replies, the cache and
the random stream are exactly those of a check at every step (benchmarks/launch_budget.py counts
the reads; tests/unit/test_sync_budget.py holds the budget).

    session = KVSession(model, pad_id)
    replies = session.turn(chunks, SamplingParams(temperature=1.0), stop_ids, generator)
    session.keep([0, 2])                      # rows 0 and 2 play on
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0            # 0 = off; HF generate's default of 50 would truncate a tiny vocabulary
    max_new_tokens: int = 96
    greedy: bool = False
    max_context_tokens: int = 2048
    compile: bool = False     # static cache and a compiled decode step (rollout/compiled.py)


# Decode steps between two reads of "has every row stopped?" where a read stalls the device.
STOP_EVERY = 8


def sample_tokens(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None
                  ) -> torch.Tensor:
    """logits [R, V] -> token ids [R]."""
    if p.greedy:
        return logits.argmax(-1)
    logits = logits.float()
    if p.temperature != 1.0:  # dividing by 1 changes no bit: one kernel less per step
        logits = logits / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= p.top_p   # keep the token that crosses top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def cache_kwarg(model) -> str:
    """Name of the model's KV-cache argument: transformers 5 renamed `past_key_values` to `cache`
    (and the output attribute with it); older releases still use the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def takes_bool_4d_mask(model) -> bool:
    """Whether a decode step may hand the model its attention mask ready-made, [R, 1, 1, columns]
    bool: SDPA attention and full attention in every layer (a sliding-window layer needs its own
    mask). transformers otherwise derives it from the 2-D mask and reads the mask's values to do so,
    which is a host-device synchronisation at every step."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (getattr(config, "_attn_implementation", None) == "sdpa" and not getattr(config, "use_sliding_window", False)
            and all(t == "full_attention" for t in layer_types))


def default_stop_every(device: torch.device) -> int:
    """On a CPU reading a flag costs nothing and a step run in vain costs a forward: check every step."""
    return 1 if device.type == "cpu" else STOP_EVERY


def sampling_generator(generator: torch.Generator | None, p: SamplingParams, device: torch.device):
    """The generator sampling draws from (the device's default one when none is given, which is
    what ``generator=None`` means to torch), so that its state can be saved and restored; None for
    greedy decoding, or where torch keeps no default generator we can name."""
    if p.greedy:
        return None
    if generator is not None:
        return generator
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return None


def keep_columns(cache, n: int) -> None:
    """Keep the first n columns of every layer of a dynamic cache (its own ``crop`` changed the
    meaning of its argument across transformers releases)."""
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]
    else:
        cache.key_cache = [k[..., :n, :] for k in cache.key_cache]
        cache.value_cache = [v[..., :n, :] for v in cache.value_cache]


class KVSession:
    """A batch of token streams sharing one KV cache; rows can be appended to, decoded and dropped.

    ``stop_every``: decode steps between two checks of whether every row has stopped (default: 1
    on a CPU, `STOP_EVERY` elsewhere); any value gives the same replies."""

    def __init__(self, model, pad_id: int, *, stop_every: int | None = None):
        self.model = model
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.mask = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [R, L] over cache columns
        self.next_pos: torch.Tensor | None = None                           # [R] real tokens so far
        self.pending: list[list[int]] = []  # sampled but not yet fed (a row's final reply token)
        self.cache_arg = cache_kwarg(model)
        self.stop_every = stop_every or default_stop_every(self.device)
        self.mask_4d = takes_bool_4d_mask(model)

    def _forward(self, ids: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
        """Feed ids [R, A] (chunk_mask marks real tokens); returns last-position logits [R, V]."""
        R, A = ids.shape
        if self.next_pos is None:
            self.next_pos = torch.zeros(R, dtype=torch.long, device=self.device)
            self.mask = torch.zeros(R, 0, dtype=torch.bool, device=self.device)
        past = self.mask.shape[1]
        pos = self.next_pos[:, None] + chunk_mask.cumsum(-1) - 1
        self.mask = torch.cat([self.mask, chunk_mask.bool()], dim=1)
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos.clamp(min=0),
                         use_cache=True, logits_to_keep=1, **{self.cache_arg: self.cache},
                         cache_position=torch.arange(past, past + A, device=self.device))
        self.next_pos = self.next_pos + chunk_mask.sum(-1)
        return out.logits[:, -1, :]

    def append(self, chunks: list[list[int]]) -> torch.Tensor:
        """Append one chunk per row (right-aligned); returns next-token logits [R, V]."""
        if self.pending:
            chunks = [p + c for p, c in zip(self.pending, chunks)]
            self.pending = []
        A = max(len(c) for c in chunks)
        ids = torch.full((len(chunks), A), self.pad_id, dtype=torch.long)
        chunk_mask = torch.zeros(len(chunks), A, dtype=torch.long)
        for r, c in enumerate(chunks):
            if c:
                ids[r, A - len(c):] = torch.tensor(c)
                chunk_mask[r, A - len(c):] = 1
        return self._forward(ids.to(self.device), chunk_mask.to(self.device))

    def decode(self, logits: torch.Tensor, p: SamplingParams, stop_ids: torch.Tensor,
               generator: torch.Generator | None) -> list[list[int]]:
        """Sample one reply per row, in lock-step, until every row stops; returns the replies.

        Tokens stay on the device until the end of the turn; every ``stop_every`` steps one flag
        (has every row stopped?) is read. The random state before each step since the last check
        is kept, so that steps run after the last row stopped can be undone (`_finish`)."""
        R, past = logits.shape[0], self.columns()
        gen = sampling_generator(generator, p, self.device)
        every = self.stop_every if gen is not None or p.greedy else 1  # no state to rewind: never overshoot
        self._reserve(p.max_new_tokens)
        cache_pos = torch.arange(past, past + p.max_new_tokens, device=self.device)
        finished = torch.zeros(R, dtype=torch.bool, device=self.device)
        toks: list[torch.Tensor] = []
        states: dict[int, torch.Tensor] = {}
        for step in range(p.max_new_tokens):
            if every > 1 and gen is not None:
                states[step] = gen.get_state()
            tok = sample_tokens(logits, p, gen)
            toks.append(tok)
            stopped = finished
            finished = finished | torch.isin(tok, stop_ids)
            last = step == p.max_new_tokens - 1
            if last or (step + 1) % every == 0:
                if last or bool(finished.all()):
                    break
                states.clear()  # a row is still going: every step so far counts
            logits = self._step(tok.masked_fill(stopped, self.pad_id), ~stopped, past + step, cache_pos[step:step + 1])
        return self._finish(toks, stop_ids, past, gen, states)

    def columns(self) -> int:
        """Cache columns in use (every row has one entry per column, masked out or not)."""
        return self.mask.shape[1]

    def _reserve(self, n: int) -> None:
        """Room in the mask for n more columns, written one per decode step."""
        self.mask = torch.cat([self.mask, self.mask.new_zeros(self.mask.shape[0], n)], dim=1)

    def _cut(self, n: int) -> None:
        """Forget every cache column from n on."""
        if self.cache.get_seq_length() > n:
            keep_columns(self.cache, n)
        self.mask = self.mask[:, :n]

    def _step(self, tok: torch.Tensor, live: torch.Tensor, col: int, cache_pos: torch.Tensor) -> torch.Tensor:
        """One decode forward: each row's token into cache column `col`, masked out where the row
        has stopped; returns next-token logits [R, V]."""
        self.mask[:, col] = live
        self.next_pos = self.next_pos + live
        mask = self.mask[:, None, None, :col + 1] if self.mask_4d else self.mask[:, :col + 1]
        out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=(self.next_pos - 1)[:, None],
                         use_cache=True, logits_to_keep=1, **{self.cache_arg: self.cache}, cache_position=cache_pos)
        return out.logits[:, -1, :]

    def _finish(self, toks: list[torch.Tensor], stop_ids: torch.Tensor, past: int, gen,
                states: dict) -> list[list[int]]:
        """Read the turn's tokens (the one read of the turn), cut each reply after its stop token,
        and undo the steps run after the last row stopped: their cache columns are dropped and the
        generator is put back to where it stood after that row's last draw."""
        T = torch.stack(toks, dim=1)                                            # [R, steps]
        stop = torch.isin(T, stop_ids)
        lengths = torch.where(stop.any(1), stop.int().argmax(1) + 1, T.shape[1])
        rows = torch.cat([T, lengths[:, None]], dim=1).tolist()
        n = [row.pop() for row in rows]
        last = max(n) - 1                  # the step at which the last row stopped
        if last < len(toks) - 1 and last + 1 in states:  # steps last+1.. ran in vain
            gen.set_state(states[last + 1])
        self._cut(past + last)            # (the final step feeds nothing: its tokens are pending)
        # The last sampled token of each row still going at that step is not in the cache yet.
        self.pending = [[row[last]] if k == last + 1 else [] for row, k in zip(rows, n)]
        return [row[:k] for row, k in zip(rows, n)]

    def turn(self, chunks: list[list[int]], p: SamplingParams, stop_ids: torch.Tensor,
             generator: torch.Generator | None) -> list[list[int]]:
        """Append each row's new env text and sample its reply (the rollout loop's one call per turn)."""
        return self.decode(self.prefill(chunks), p, stop_ids, generator)

    def prefill(self, chunks: list[list[int]]) -> torch.Tensor:
        """Append each row's chunk; returns next-token logits [R, V]."""
        if self.next_pos is not None:
            return self.append(chunks)
        # Episodes of a group start from the same prompt: encode each distinct one once.
        uniq = list(dict.fromkeys(map(tuple, chunks)))
        owner = [uniq.index(tuple(c)) for c in chunks]
        logits = self.append([list(u) for u in uniq])
        self.keep(owner)
        return logits[owner]

    def keep(self, rows: list[int]) -> None:
        """Keep the listed rows in that order: drops episodes that ended, and a row listed several
        times is copied (one shared prompt encoded once, then handed to every episode of its group)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]
        self.next_pos = self.next_pos[idx]
        self.pending = [self.pending[r] for r in rows] if self.pending else []
