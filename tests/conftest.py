"""Shared test gates.

``sandbox``: tests that run programs in the code sandbox fail, loudly and with the reason, on a
machine that cannot sandbox (no bubblewrap, not root, ...), instead of skipping unseen. Set
RAGEN2_SKIP_SANDBOX_TESTS=1 to skip them on purpose (the reason is still printed)."""
import os
import sys

import pytest

SKIP_VARIABLE = "RAGEN2_SKIP_SANDBOX_TESTS"


@pytest.fixture
def sandbox():
    from ragen2_core.envs import sandbox as module

    problem = module.isolation_problem()
    if problem:
        why = f"sandbox tests cannot run here: {problem}"
        print(f"\n{why}", file=sys.stderr)
        if os.environ.get(SKIP_VARIABLE) == "1":
            pytest.skip(f"{why} ({SKIP_VARIABLE}=1)")
        pytest.fail(f"{why}. To skip the sandbox tests on purpose, set {SKIP_VARIABLE}=1.", pytrace=False)
    return module


@pytest.fixture(scope="module")
def policy():
    """A tiny random-init Qwen2 with a tokenizer trained on FrozenLake prompts and grounded replies:
    enough for the rollout engine's plumbing (tokens, caches, syncs), not for playing."""
    from ragen2_core.envs.registry import make_env
    from ragen2_core.policy.model import build_tiny_qwen2
    from ragen2_core.policy.tokenizer import train_tokenizer
    from ragen2_core.rollout.prompt import first_chunk

    env = make_env("frozenlake", slip=0.0)
    texts = []
    for s in range(30):
        texts.append(first_chunk(env.system_prompt(), env.reset(s), 10, 16))
        texts.append(env.expert_turn("grounded").think + "</think><answer>Down || Left</answer>")
    tok = train_tokenizer(texts, vocab_size=300)
    model = build_tiny_qwen2(tok, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, seed=0).eval()
    return model, tok


@pytest.fixture
def check_rollout_ids():
    """``check(batch, tok, prompt_format)``: every row of a rollout is the format's pieces, rebuilt from the
    row's messages alone, alternating with the sampled replies (the ids trained on are the ids
    generated from, across turns). Returns each row's reply ids."""
    return _check_rollout_ids


def _check_rollout_ids(batch, tok, prompt_format):
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    eot = enc(prompt_format.end_of_turn)[0] if prompt_format.end_of_turn else None
    out = []
    for b in range(len(batch)):
        ids, mask, msgs = batch.token_ids[b], batch.response_mask[b], batch.messages[b]
        runs, start = [], 0  # alternating (piece, reply) runs of the row
        for i in range(1, len(ids) + 1):
            if i == len(ids) or mask[i] != mask[start]:
                runs.append((mask[start], ids[start:i]))
                start = i
        pieces = [r for m, r in runs if m == 0]
        replies = [r for m, r in runs if m == 1]
        assert len(pieces) == len(replies) == batch.n_turns[b] == sum(m["role"] == "assistant" for m in msgs)
        conv = prompt_format.start(msgs[0]["content"], msgs[1]["content"])
        assert pieces[0] == enc(conv.text) and batch.prompt_len[b] == len(pieces[0])
        for k in range(1, len(pieces)):
            conv.reply(msgs[2 * k]["content"].removeprefix("<think>"))
            expect = enc(conv.follow(msgs[2 * k + 1]["content"]))
            if replies[k - 1][-1] == eot:
                expect = expect[1:]  # the policy closed its own turn; the piece does not repeat it
            assert pieces[k] == expect
        out.append(replies)
    return out
