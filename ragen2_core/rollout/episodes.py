"""Batched multi-turn episodes: every live episode advances one turn at a time on one sampler
session (rollout/sampler.py), its conversation rendered piece by piece (rollout/prompt.py).

    batch = rollout(model, tok, make_env, env_seeds=[...], dynamics_seeds=[...], group_ids=[...],
                    sampling=SamplingParams(temperature=1.0), generator=torch.Generator().manual_seed(0))
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ragen2_core.envs.base import TextEnv
from ragen2_core.rollout.prompt import RAW, RawFormat, user_text
from ragen2_core.rollout.sampler import KVSession, SamplingParams
from ragen2_core.batches import RolloutBatch


def new_session(model, pad_id: int, p: SamplingParams) -> KVSession:
    """The session `rollout` plays on by default: `KVSession`, or with ``p.compile`` its static,
    compiled form."""
    if not p.compile:
        return KVSession(model, pad_id)
    from ragen2_core.rollout.compiled import StaticKVSession
    return StaticKVSession(model, pad_id)


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
            generator: torch.Generator | None = None, prompt_format: RawFormat = RAW, session=None) -> RolloutBatch:
    """Play len(env_seeds) episodes to the end, all in one batch; ``prompt_format`` renders the conversation
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
    eot = single_token_id(tokenizer, prompt_format.end_of_turn) if prompt_format.end_of_turn else None
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
    convs = [prompt_format.start(env.system_prompt(), user_text(1, o, env.actions_left, sampling.max_new_tokens))
             for env, o in zip(envs, obs)]
    chunks = [enc(c.text) for c in convs]
    prompt_len = [len(c) for c in chunks]

    session = session if session is not None else new_session(model, tokenizer.pad_token_id, sampling)
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
