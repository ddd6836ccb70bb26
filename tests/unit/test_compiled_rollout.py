"""rollout.compile: the static cache and the compiled decode step play the default engine's episodes.

Bit-identical logits are not promised (attention over the static cache's masked-out columns and the
compiler's fused kernels round differently), so what is held is what a run sees: the
same tokens, greedy and sampled with one seeded generator, and the same draws after the rollout.
The quick test traces the decode step with torch.compile's "eager" backend (the static cache, the
fixed rows and the rewinding, without code generation); the slow one compiles it with inductor.
"""
import pytest
import torch

from ragen2_core.config import ConfigError, load_config
from ragen2_core.envs.registry import make_env
from ragen2_core.rollout import compiled
from ragen2_core.rollout.compiled import StaticKVSession
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import SamplingParams

SAMPLINGS = [dict(greedy=True), dict(temperature=1.0), dict(temperature=0.8, top_p=0.9)]


def play(policy, session, **kw):
    model, tok = policy
    seeds = [1, 2, 2, 3, 4, 4, 5, 6]
    g = torch.Generator().manual_seed(0)
    batch = rollout(model, tok, lambda: make_env("frozenlake", slip=0.1, max_turns=3), env_seeds=seeds,
                    dynamics_seeds=list(range(len(seeds))), group_ids=seeds, generator=g, session=session,
                    sampling=SamplingParams(**{"max_new_tokens": 16, **kw}))
    return batch.token_ids, batch.n_turns, torch.rand(3, generator=g).tolist()


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_static_cache_session_plays_the_default_episodes(policy, sampling, monkeypatch):
    # A narrow bucket makes later turns outgrow the first static cache: the move is tested too.
    monkeypatch.setattr(compiled, "COLUMN_BUCKET", 64)
    model, tok = policy
    static = StaticKVSession(model, tok.pad_token_id, backend="eager")
    assert play(policy, static, **sampling) == play(policy, None, **sampling)


@pytest.mark.slow
def test_inductor_compiled_session_plays_the_default_episodes(policy):
    model, tok = policy
    for sampling in SAMPLINGS:
        assert play(policy, StaticKVSession(model, tok.pad_token_id), **sampling) == play(policy, None, **sampling)


def test_compile_config_is_checked():
    assert load_config(None).rollout.compile is False
    assert load_config(None, ["rollout.compile=true"]).rollout.compile is True
    with pytest.raises(ConfigError, match=r"rollout.compile: true applies to backend: hf"):
        load_config(None, ["rollout.compile=true", "rollout.backend=vllm"])
