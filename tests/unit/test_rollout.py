"""Rollout engine: masks, cache correctness, batching invariance, sampling knobs.

A random-init tiny Qwen2 is enough here: the engine must be right whatever the policy says.
"""
import math

import pytest
import torch

from ragen2_core.envs.registry import make_env
from ragen2_core.policy.model import build_tiny_qwen2
from ragen2_core.policy.tokenizer import train_tokenizer
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import KVSession, SamplingParams, sample_tokens
from ragen2_core.rollout.prompt import first_chunk


@pytest.fixture(scope="module")
def policy():
    env = make_env("frozenlake", slip=0.0)
    texts = []
    for s in range(30):
        obs = env.reset(s)
        texts.append(first_chunk(env.system_prompt(), obs, 10, 16))
        texts.append(env.expert_turn("grounded").think + "</think><answer>Down || Left</answer>")
    tok = train_tokenizer(texts, vocab_size=300)
    model = build_tiny_qwen2(tok, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, seed=0).eval()
    return model, tok


def make_fl():
    return make_env("frozenlake", slip=0.0)


def play(policy, seeds, **kw):
    model, tok = policy
    p = SamplingParams(**{"max_new_tokens": 12, "greedy": True, **kw})
    return rollout(model, tok, make_fl, env_seeds=seeds, dynamics_seeds=seeds, group_ids=seeds,
                   sampling=p, generator=torch.Generator().manual_seed(0))


def test_response_mask_covers_exactly_the_replies(policy):
    _, tok = policy
    batch = play(policy, [1, 2, 3])
    for b in range(len(batch)):
        ids, mask = batch.token_ids[b], batch.response_mask[b]
        assert len(ids) == len(mask) == len(batch.token_rewards[b])
        env_text = tok.decode([t for t, m in zip(ids, mask) if m == 0])
        model_text = tok.decode([t for t, m in zip(ids, mask) if m == 1])
        assert "Board size" in env_text and "Turn 1:" in env_text
        assert "Board size" not in model_text and "Turn " not in model_text
        # every reply is masked in, and the replies are all the model produced
        assert model_text == "".join(r[len("<think>"):] for r in batch.responses[b])
        assert sum(batch.token_rewards[b]) == pytest.approx(batch.episode_reward[b])
        assert batch.prompt_len[b] == mask.index(1)


def test_think_spans_lie_inside_replies(policy):
    batch = play(policy, [4, 5])
    for b in range(len(batch)):
        assert len(batch.think_spans[b]) == batch.n_turns[b]
        for s, e in batch.think_spans[b]:
            assert s <= e and all(batch.response_mask[b][i] == 1 for i in range(s, e))


# Distinct seeds, and repeated ones (a repeated prompt is encoded once and its cache copied to every
# episode of the seed): each episode must play exactly as it would alone (greedy, so deterministic).
@pytest.mark.parametrize("seeds", [[7, 8, 9, 10, 11], [7, 7, 8, 7, 8]])
def test_batched_equals_one_at_a_time_greedy(policy, seeds):
    batched = play(policy, seeds)
    for i, s in enumerate(seeds):
        alone = play(policy, [s])
        assert alone.token_ids[0] == batched.token_ids[i]
        assert alone.think_spans[0] == batched.think_spans[i]
        assert alone.episode_reward[0] == batched.episode_reward[i]


def test_cache_with_inner_padding_matches_full_forward(policy):
    model, tok = policy
    rows = [[5, 6, 7, 8, 9], [10, 11]]
    extra = [[12], [13, 14, 15]]
    s = KVSession(model, tok.pad_token_id)
    s.append(rows)
    logits = s.append(extra)
    for r in range(2):
        full = torch.tensor([rows[r] + extra[r]])
        ref = model(input_ids=full).logits[0, -1]
        torch.testing.assert_close(logits[r], ref, atol=1e-5, rtol=1e-5)


def test_sampling_knobs():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 64)
    g = torch.Generator().manual_seed(0)
    # top_k = 1 and a tiny top_p both leave only the argmax (index 1)
    assert (sample_tokens(logits, SamplingParams(top_k=1), g) == 1).all()
    assert (sample_tokens(logits, SamplingParams(top_p=1e-3), g) == 1).all()
    # top_k = 2 keeps indices 1 and 3 only, and both appear over 64 draws
    drawn = set(sample_tokens(logits, SamplingParams(top_k=2), g).tolist())
    assert drawn == {1, 3}


def test_context_limit_truncates(policy):
    model, tok = policy
    n_first = len(tok.encode(first_chunk(make_fl().system_prompt(), make_fl().reset(0), 10, 12)))
    batch = play(policy, [0, 1], max_context_tokens=n_first + 12)
    assert all(batch.truncated) and all(t == 1 for t in batch.n_turns)


def test_batch_stats_counts_template_turns_and_splits_success_by_first_style():
    from ragen2_core.rollout.evaluate import batch_stats
    from ragen2_core.batches import RolloutBatch
    T = "Let me think."
    responses = [[f"<think>{T}</think><answer>Up</answer>", "<think>At (0, 1): Up</think><answer>Up</answer>"],
                 [f"<think> {T} </think><answer>Up</answer>"],
                 ["<think>At (2, 2): Left</think><answer>Left</answer>"]]
    n = len(responses)
    batch = RolloutBatch(token_ids=[[1]] * n, response_mask=[[1]] * n, token_rewards=[[0.0]] * n,
                         episode_reward=[1.0, 0.0, 1.0], success=[True, False, True], group_ids=[0, 1, 2],
                         env_seeds=[0, 1, 2], n_turns=[2, 1, 1], n_valid_turns=[2, 1, 1],
                         think_spans=[[(0, 1)] * len(r) for r in responses], prompt_len=[1] * n,
                         responses=responses)
    stats = batch_stats(batch, T)
    # Template turns: episode 0 turn 1 and episode 1 (spaces stripped): 2 of 4 turns. By first turn,
    # episodes 0 (won) and 1 (lost) are template, episode 2 (won) grounded.
    assert stats["template_frac"] == 0.5
    assert stats["success_template"] == 0.5 and stats["success_grounded"] == 1.0
    assert "template_frac" not in batch_stats(batch)
    only_grounded = batch_stats(batch, "a sentence nobody wrote")
    assert only_grounded["template_frac"] == 0.0 and math.isnan(only_grounded["success_template"])
