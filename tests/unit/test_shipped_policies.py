"""The policies kept in the repository: every trial of the demo's and the study's sweeps finds its
embedded policy there by the cache key, so a fresh clone needs no warm start; the files are real
(not Git LFS pointers) and small.

A failure here after a change to a config, the env text or the trace format means the shipped
policies are stale: rebuild and ship them (README, "Shipped policies").
"""
import json
import struct
from pathlib import Path

import pytest

from ragen2_core.config import load_config
from ragen2_core.policy.warmstart import SHIPPED, cache_key
from ragen2_core.sweep.trials import load_spec

ROOT = Path(__file__).resolve().parents[2]
# Until the first policies are committed there is nothing to check; once any is, every check holds.
pytestmark = pytest.mark.skipif(
    not any(SHIPPED.glob("embedded-*/ragen2_meta.json")),
    reason="NO SHIPPED POLICY in ragen2_core/policy/shipped/: a fresh clone warm-starts for tens of "
           "minutes; build and ship them with `ragen2 warmstart --config <base> --rebuild --ship` (README)")
SPECS = ["smoke", "kl_vs_filter", "entropy_vs_filter", "filter_strength", "env_noise", "annealing"]
LIMIT_BYTES = 10 * 2**20


def _key(cfg) -> str:
    return f"embedded-{cache_key(cfg.policy, cfg.warmstart, cfg.env)}"


@pytest.mark.parametrize("base", ["frozenlake_tiny", "frozenlake_scan"])
def test_base_config_policy_is_shipped(base):
    cfg = load_config(ROOT / "sweeps" / "base" / f"{base}.yaml")
    assert (SHIPPED / _key(cfg) / "ragen2_meta.json").is_file(), f"{base}: no shipped {_key(cfg)}"


@pytest.mark.parametrize("name", SPECS)
def test_every_trial_of_the_demo_and_study_sweeps_finds_a_shipped_policy(name):
    spec, trials = load_spec(ROOT / "ablations" / f"{name}.yaml")
    keys = {_key(load_config(spec.base_path, t.overrides)) for t in trials}
    assert len(keys) == 1, f"{name}: trials need {len(keys)} different policies: {sorted(keys)}"
    assert (SHIPPED / keys.pop() / "ragen2_meta.json").is_file()


def test_shipped_files_are_real_weights_and_small():
    dirs = sorted(p for p in SHIPPED.iterdir() if p.is_dir())
    assert len(dirs) >= 2
    total = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    assert total <= LIMIT_BYTES, f"shipped policies take {total / 2**20:.1f} MB (limit 10 MB)"
    for d in dirs:
        blob = (d / "model.safetensors").read_bytes()
        # A safetensors file starts with the little-endian length of its JSON header; an LFS pointer
        # is a short text file starting "version https://git-lfs".
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
        assert "model.embed_tokens.weight" in header, d.name
        meta = json.loads((d / "ragen2_meta.json").read_text())
        assert meta["params"] > 0 and "final_loss" in meta, d.name
        assert (d / "tokenizer.json").is_file() and (d / "config.json").is_file(), d.name
