"""A policy and batch small enough that a training run takes seconds (plumbing, not learning)."""
from ragen2_core.config import load_config

TINY = ["policy.hidden_size=32", "policy.num_layers=1", "policy.num_heads=2", "policy.num_kv_heads=1",
        "policy.intermediate_size=64", "policy.vocab_size=300", "warmstart.envs=[frozenlake]",
        "warmstart.steps=30", "warmstart.episodes=64", "warmstart.batch_size=8",
        "rollout.n_groups=2", "rollout.group_size=3", "rollout.max_new_tokens=24",
        "env.max_turns=2", "env.val_seeds=4", "train.eval_every=2", "train.threads=1",
        "algo.actor_lr=1e-3"]


def cfg_for(tmp, cache, *extra):
    return load_config(None, TINY + [f"policy.cache_dir={cache}", f"train.output_dir={tmp}", *extra])
