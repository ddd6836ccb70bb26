"""The warm start must make the embedded policy clearly better than acting at random.

This builds a FrozenLake-only warm start of WARM_STEPS steps (a few minutes on 2 cores; the full
default recipe is longer) in a temporary cache and evaluates it greedily on the 100 fixed
validation seeds, against uniformly random well-formed actions on the same seeds.
"""
import torch

from ragen2_core.config import load_config
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.load import load_policy
from ragen2_core.rollout.engine import SamplingParams
from ragen2_core.rollout.evaluate import evaluate, random_baseline, val_seeds

WARM_STEPS = 400


def test_warm_start_beats_random_on_frozenlake(tmp_path):
    torch.set_num_threads(2)
    cfg = load_config("sweeps/base/frozenlake_tiny.yaml", [
        f"policy.cache_dir={tmp_path}", "warmstart.envs=[frozenlake]",
        f"warmstart.steps={WARM_STEPS}", "warmstart.episodes=1500", "warmstart.lr=3e-3"])
    model, tok, _ = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    make_env = env_factory(cfg.env)
    seeds = val_seeds(cfg.env)
    stats, _ = evaluate(model, tok, make_env, seeds=seeds,
                        sampling=SamplingParams(greedy=True, max_new_tokens=cfg.rollout.max_new_tokens))
    random_success = random_baseline(make_env, seeds=seeds)["success"]
    print(f"warm start greedy success {stats['success']:.2f} vs random {random_success:.2f}")
    # Measured when written: random 0.22 on these seeds; the warm start is expected well above.
    assert random_success < 0.35
    assert stats["format_valid"] > 0.9
    assert stats["success"] >= random_success + 0.25
