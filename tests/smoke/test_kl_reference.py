"""algo.kl_reference: the KL term pulls towards a policy other than the start (e.g. a template-only
warm start), found by path or by its embedded-<key> name, refused when it cannot be compared."""
import pytest

from ragen2_core.config import ConfigError
from ragen2_core.policy.load import load_reference, reference_path
from ragen2_core.policy.model import load_pretrained
from ragen2_core.tracking import MemorySink
from ragen2_core.train.preflight import preflight
from ragen2_core.train.trainer import run
from tiny import cfg_for


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("policy-cache")


def first_kl(tmp, cache, *extra):
    sink = MemorySink()
    run(cfg_for(tmp, cache, "train.steps=1", "train.eval_every=0", "algo.kl_coef=0.1", *extra), sink)
    return sink.history("actor/kl")[0][1]


def test_kl_is_zero_against_the_start_and_positive_against_another_policy(tmp_path, cache):
    # One on-policy step: against the start, policy and reference are the same model, so every
    # token's k3 = exp(0) - 0 - 1 = 0. A policy trained for two steps puts other log-probs there.
    assert first_kl(tmp_path / "init", cache) == 0.0
    sink = MemorySink()
    run(cfg_for(tmp_path / "other", cache, "train.steps=2", "train.eval_every=0", "algo.actor_lr=1e-2"), sink)
    other = tmp_path / "other" / "policy"
    assert first_kl(tmp_path / "towards", cache, f"algo.kl_reference={other}") > 1e-4


def test_embedded_names_resolve_in_the_cache(tmp_path, cache):
    cfg = cfg_for(tmp_path, cache)
    first_kl(tmp_path / "build", cache)  # builds the tiny policy into the cache
    name = next(p.name for p in cache.glob("embedded-*"))
    assert reference_path(name, cfg.policy) == cache / name


def test_refused_without_kl_missing_or_with_another_tokenizer(tmp_path, cache):
    with pytest.raises(ConfigError, match=r"algo.kl_reference \('x'\) is set but algo.kl_coef is 0"):
        cfg_for(tmp_path, cache, "algo.kl_reference=x")
    cfg = cfg_for(tmp_path / "run", cache, "algo.kl_coef=0.1", "algo.kl_reference=embedded-000000000000")
    problems = preflight(cfg)
    assert len(problems) == 1 and "algo.kl_reference: 'embedded-000000000000' is neither a directory" in problems[0]
    assert not (tmp_path / "run").exists()
    # A policy with its own tokenizer (another vocabulary size) cannot be the reference.
    first_kl(tmp_path / "build", cache)
    before = set(cache.glob("embedded-*"))
    first_kl(tmp_path / "small", cache, "policy.vocab_size=280")
    (small,) = set(cache.glob("embedded-*")) - before
    _, tok = load_pretrained(str(before.pop()))
    with pytest.raises(ValueError, match="has another tokenizer than the policy"):
        load_reference(str(small), cfg.policy, tok)
