"""Batched multi-turn rollout with one KV cache kept across turns.

All live episodes advance together: per turn, one batched forward appends each episode's new env
text to the cache, then a sampling loop generates every reply in lock-step until each row has
emitted ``</answer>`` (or its token budget). Episodes that end are dropped from the cache between
turns. The history is never re-encoded: that is where the speed over calling HF ``generate`` per
turn comes from (see benchmarks/rollout.py).

Rows have different lengths, so the cache is padded *inside*: each appended chunk is right-aligned
and its padding, like the tokens a row generated after it stopped, is masked out. Every row keeps
its own position counter, so a row sees exactly the positions it would see alone.

    batch = rollout(model, tok, make_env, env_seeds=[...], dynamics_seeds=[...], group_ids=[...],
                    sampling=SamplingParams(temperature=1.0), generator=torch.Generator().manual_seed(0))
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ragen2_core.envs.base import TextEnv
from ragen2_core.rollout.prompt import RAW, RawFormat, user_text
from ragen2_core.types import RolloutBatch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0            # 0 = off; HF generate's default of 50 would truncate a tiny vocabulary
    max_new_tokens: int = 96
    greedy: bool = False
    max_context_tokens: int = 2048


def sample_tokens(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None
                  ) -> torch.Tensor:
    """logits [R, V] -> token ids [R]."""
    if p.greedy:
        return logits.argmax(-1)
    logits = logits.float() / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= p.top_p   # keep the token that crosses top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def cache_kwarg(model) -> str:
    """Name of the model's KV-cache argument: transformers 5 renamed `past_key_values` to `cache`
    (and the output attribute with it); older releases still use the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class KVSession:
    """A batch of token streams sharing one KV cache; rows can be appended to, decoded and dropped."""

    def __init__(self, model, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [R, L] over cache columns
        self.next_pos: torch.Tensor | None = None                           # [R] real tokens so far
        self.pending: list[list[int]] = []  # sampled but not yet fed (a row's final reply token)
        self.cache_arg = cache_kwarg(model)

    def _forward(self, ids: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
        """Feed ids [R, A] (chunk_mask marks real tokens); returns last-position logits [R, V]."""
        R, A = ids.shape
        if self.next_pos is None:
            self.next_pos = torch.zeros(R, dtype=torch.long, device=self.device)
            self.mask = torch.zeros(R, 0, dtype=torch.long, device=self.device)
        past = self.mask.shape[1]
        pos = self.next_pos[:, None] + chunk_mask.cumsum(-1) - 1
        self.mask = torch.cat([self.mask, chunk_mask], dim=1)
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
        """Sample one reply per row, in lock-step, until every row stops; returns the replies."""
        R = logits.shape[0]
        replies: list[list[int]] = [[] for _ in range(R)]
        finished = torch.zeros(R, dtype=torch.bool, device=self.device)
        for step in range(p.max_new_tokens):
            tok = sample_tokens(logits, p, generator)
            live = ~finished
            for r in live.nonzero().flatten().tolist():
                replies[r].append(int(tok[r]))
            finished = finished | torch.isin(tok, stop_ids)
            if bool(finished.all()) or step == p.max_new_tokens - 1:
                # The last sampled token of each live row is not in the cache yet.
                self.pending = [[int(tok[r])] if live[r] else [] for r in range(R)]
                break
            tok = torch.where(live, tok, torch.full_like(tok, self.pad_id))
            logits = self._forward(tok[:, None], live.long()[:, None])
        return replies

    def turn(self, chunks: list[list[int]], p: SamplingParams, stop_ids: torch.Tensor,
             generator: torch.Generator | None) -> list[list[int]]:
        """Append each row's new env text and sample its reply (the rollout loop's one call per turn)."""
        if self.next_pos is None:
            # Episodes of a group start from the same prompt: encode each distinct one once.
            uniq = list(dict.fromkeys(map(tuple, chunks)))
            owner = [uniq.index(tuple(c)) for c in chunks]
            logits = self.append([list(u) for u in uniq])
            self.keep(owner)
            logits = logits[owner]
        else:
            logits = self.append(chunks)
        return self.decode(logits, p, stop_ids, generator)

    def keep(self, rows: list[int]) -> None:
        """Keep the listed rows in that order: drops episodes that ended, and a row listed several
        times is copied (one shared prompt encoded once, then handed to every episode of its group)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]
        self.next_pos = self.next_pos[idx]
        self.pending = [self.pending[r] for r in rows] if self.pending else []


def think_span(reply: list[int], think_close_id: int | None, tokenizer) -> tuple[int, int]:
    """[start, end) within the reply of the reasoning (the reply starts inside <think>)."""
    if think_close_id is not None:
        end = reply.index(think_close_id) if think_close_id in reply else len(reply)
        return 0, end
    tag_len = len(tokenizer.encode("</think>", add_special_tokens=False))
    for end in range(len(reply) + 1):  # multi-token tag: first prefix whose text closes the think
        if "</think>" in tokenizer.decode(reply[:end]):
            return 0, max(0, end - tag_len)
    return 0, len(reply)


def single_token_id(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


@torch.no_grad()
def rollout(model, tokenizer, make_env: Callable[[], TextEnv], *, env_seeds: list[int],
            dynamics_seeds: list[int], group_ids: list[int], sampling: SamplingParams,
            generator: torch.Generator | None = None, fmt: RawFormat = RAW, session=None) -> RolloutBatch:
    """Play len(env_seeds) episodes to the end, all in one batch; ``fmt`` renders the conversation
    (rollout/prompt.py: raw text or a chat template). ``session`` generates the replies: by default
    a :class:`KVSession` on ``model``; anything with the same ``turn`` and ``keep`` (the vLLM
    backend, rollout/vllm_backend.py) plays the same episodes."""
    was_training = model.training
    model.eval()
    B = len(env_seeds)
    envs = [make_env() for _ in range(B)]
    obs = [env.reset(s, dynamics_seed=d) for env, s, d in zip(envs, env_seeds, dynamics_seeds)]
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    # A chat template's end-of-turn token also ends a reply; the template supplies it otherwise.
    eot = single_token_id(tokenizer, fmt.end_of_turn) if fmt.end_of_turn else None
    stop = [t for t in (single_token_id(tokenizer, "</answer>"), tokenizer.eos_token_id, eot) if t is not None]
    device = next(model.parameters()).device
    stop_ids = torch.tensor(stop, dtype=torch.long, device=device)
    if generator is not None and generator.device != device:
        # torch.multinomial needs a generator on the logits' device: a CPU generator (how callers
        # seed) with a model on the GPU seeds one there, so a seed still fixes the rollout.
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        generator = torch.Generator(device=device).manual_seed(seed)
    close_id = single_token_id(tokenizer, "</think>")

    token_ids = [[] for _ in range(B)]
    response_mask = [[] for _ in range(B)]
    token_rewards = [[] for _ in range(B)]
    think_spans = [[] for _ in range(B)]
    responses = [[] for _ in range(B)]
    step_infos = [[] for _ in range(B)]
    episode_reward, n_valid = [0.0] * B, [0] * B
    n_turns, success, truncated = [0] * B, [False] * B, [False] * B
    convs = [fmt.start(env.system_prompt(), user_text(1, o, env.actions_left, sampling.max_new_tokens))
             for env, o in zip(envs, obs)]
    chunks = [enc(c.text) for c in convs]
    prompt_len = [len(c) for c in chunks]

    session = session if session is not None else KVSession(model, tokenizer.pad_token_id)
    active = list(range(B))
    while active:
        # Episodes whose next turn could not fit in the context end here, truncated.
        fits = [b for b, c in zip(active, chunks)
                if len(token_ids[b]) + len(c) + sampling.max_new_tokens <= sampling.max_context_tokens]
        if len(fits) < len(active):
            for b in set(active) - set(fits):
                truncated[b] = True
                if len(convs[b].messages) > 2:
                    convs[b].messages.pop()  # the user message whose piece did not fit
            keep_rows = [i for i, b in enumerate(active) if b in fits]
            if not fits:
                break
            session.keep(keep_rows)
            chunks = [chunks[i] for i in keep_rows]
            active = fits
        replies = session.turn(chunks, sampling, stop_ids, generator)
        still, next_chunks = [], []
        for row, (b, chunk, reply) in enumerate(zip(active, chunks, replies)):
            start = len(token_ids[b]) + len(chunk)
            s, e = think_span(reply, close_id, tokenizer)
            think_spans[b].append((start + s, start + e))
            token_ids[b] += chunk + reply
            response_mask[b] += [0] * len(chunk) + [1] * len(reply)
            said = tokenizer.decode(reply, skip_special_tokens=True)
            text = "<think>" + said
            convs[b].reply(said)
            result = envs[b].step(text)
            token_rewards[b] += [0.0] * (len(chunk) + len(reply))
            if reply:
                token_rewards[b][-1] = float(result.reward)
            responses[b].append(text)
            step_infos[b].append(dict(result.info))
            episode_reward[b] += float(result.reward)
            n_turns[b] += 1
            n_valid[b] += int(bool(result.info.get("format_valid", False)))
            if result.done:
                success[b] = bool(result.success)
                continue
            still.append(row)
            piece = enc(convs[b].follow(user_text(n_turns[b] + 1, result.observation,
                                                  envs[b].actions_left, sampling.max_new_tokens,
                                                  reward=result.reward)))
            if eot is not None and reply and reply[-1] == eot and piece[:1] == [eot]:
                piece = piece[1:]  # the policy closed its turn itself
            next_chunks.append(piece)
        if len(still) < len(active):
            if not still:
                break
            session.keep(still)
        active = [active[r] for r in still]
        chunks = next_chunks
    model.train(was_training)
    return RolloutBatch(
        token_ids=token_ids, response_mask=response_mask, token_rewards=token_rewards,
        episode_reward=episode_reward, success=success, group_ids=list(group_ids),
        env_seeds=list(env_seeds), n_turns=n_turns, n_valid_turns=n_valid, think_spans=think_spans,
        prompt_len=prompt_len, responses=responses, truncated=truncated, step_infos=step_infos,
        messages=[c.messages for c in convs],
        behavior_logp=[session.logps[b] for b in range(B)] if hasattr(session, "logps") else [],
    )
