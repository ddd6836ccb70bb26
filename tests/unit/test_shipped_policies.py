"""The policies kept in the repository: every trial of the demo's and the doors study's sweeps (and
its pilots) needs the policy of its base config, found in ragen2_core/policy/shipped/ by the cache
key, so a fresh clone needs no warm start; the files are real (not Git LFS pointers) and small.

A failure here after a change to a config, the env text or the trace format means the shipped
policies are stale: rebuild and ship them (README, "Shipped policies"). A policy not shipped at all
is reported as a skip that names it and the command that ships it.
"""
import json
import struct
from pathlib import Path

import pytest

from ragen2_core.config import load_config
from ragen2_core.policy.warmstart import SHIPPED, cache_key
from ragen2_core.sweep.trials import load_spec

ROOT = Path(__file__).resolve().parents[2]
USERS = {"frozenlake_tiny": ["smoke"],
         "doors": ["filter_vs_nofilter", "filter_vs_nofilter_ppo", "kl_vs_filter", "entropy_vs_filter",
                   "filter_strength", "env_noise", "annealing", "pilots/doors_pilot_learning",
                   "pilots/doors_pilot_ppo", "pilots/doors_pilot_regularisers", "pilots/doors_pilot_entropy"]}
LIMIT_BYTES = 10 * 2**20


def _key(cfg) -> str:
    return f"embedded-{cache_key(cfg.policy, cfg.warmstart, cfg.env)}"


def _base_key(base: str) -> str:
    return _key(load_config(ROOT / "sweeps" / "base" / f"{base}.yaml"))


@pytest.mark.parametrize("base,spec_name", [(b, s) for b, specs in USERS.items() for s in specs])
def test_every_trial_of_the_demo_and_study_sweeps_needs_its_base_policy(base, spec_name):
    spec, trials = load_spec(ROOT / "ablations" / f"{spec_name}.yaml")
    assert spec.base_path == ROOT / "sweeps" / "base" / f"{base}.yaml"
    keys = {_key(load_config(spec.base_path, t.overrides)) for t in trials}
    assert keys == {_base_key(base)}, f"{spec_name}: its trials need {sorted(keys)}, not only the shipped one"


@pytest.mark.parametrize("base", list(USERS))
def test_base_config_policy_is_shipped(base):
    key = _base_key(base)
    if not (SHIPPED / key / "ragen2_meta.json").is_file():
        pytest.skip(f"NOT SHIPPED: {key} ({base}.yaml, used by {', '.join(USERS[base])}) is not in "
                    f"ragen2_core/policy/shipped/, so a fresh clone warm-starts it for tens of minutes; ship it "
                    f"with `ragen2 warmstart --config sweeps/base/{base}.yaml --rebuild --ship` (README)")
    blob = (SHIPPED / key / "model.safetensors").read_bytes()
    # A safetensors file starts with the little-endian length of its JSON header; an LFS pointer is a
    # short text file starting "version https://git-lfs".
    (n,) = struct.unpack("<Q", blob[:8])
    assert "model.embed_tokens.weight" in json.loads(blob[8:8 + n])
    meta = json.loads((SHIPPED / key / "ragen2_meta.json").read_text())
    assert meta["params"] > 0 and "final_loss" in meta
    assert (SHIPPED / key / "tokenizer.json").is_file() and (SHIPPED / key / "config.json").is_file()


def test_shipped_policies_stay_small():
    total = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file()) if SHIPPED.is_dir() else 0
    assert total <= LIMIT_BYTES, f"shipped policies take {total / 2**20:.1f} MB (limit 10 MB)"
