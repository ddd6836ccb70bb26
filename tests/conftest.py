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
