"""The default warm start must make the embedded policy clearly better than acting at random.

Slow tier: it builds (or reuses, from ~/.cache/ragen2) the default embedded policy, which takes
tens of minutes on 2 cores the first time, then evaluates it greedily on the 100 fixed validation
seeds of each env against uniformly random well-formed actions on the same seeds.
"""
import pytest
import torch

from ragen2_core.config import load_config
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.load import load_policy
from ragen2_core.rollout.engine import SamplingParams
from ragen2_core.rollout.evaluate import evaluate, random_baseline, val_seeds


@pytest.mark.slow
@pytest.mark.parametrize("env", ["frozenlake", "sokoban"])
def test_default_warm_start_beats_random(env):
    torch.set_num_threads(2)
    cfg = load_config("sweeps/base/frozenlake_tiny.yaml", [f"env.name={env}"])
    model, tok, _ = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    make_env = env_factory(cfg.env)
    seeds = val_seeds(cfg.env)
    stats, _ = evaluate(model, tok, make_env, seeds=seeds,
                        sampling=SamplingParams(greedy=True, max_new_tokens=cfg.rollout.max_new_tokens))
    random_success = random_baseline(make_env, seeds=seeds)["success"]
    print(f"{env}: warm start greedy success {stats['success']:.2f} vs random {random_success:.2f}")
    assert stats["format_valid"] > 0.9
    assert stats["success"] >= random_success + 0.15
