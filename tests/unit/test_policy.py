"""Embedded tokenizer and policy: round trips, HF save/load, warm-start cache."""
import dataclasses
import hashlib
import json

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from ragen2_core.config import ConfigError, load_config
from ragen2_core.envs.registry import make_env
from ragen2_core.policy import warmstart
from ragen2_core.policy.load import load_policy
from ragen2_core.policy.model import build_tiny_qwen2, save_policy
from ragen2_core.policy.tokenizer import TAGS, train_tokenizer
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import SamplingParams

SYMBOLS = "#_OX√PSG"  # both envs' legends


@pytest.fixture(scope="module")
def tok():
    texts = []
    for name in ("frozenlake", "sokoban"):
        env = make_env(name, slip=0.0)
        for s in range(20):
            texts.append(env.system_prompt() + env.reset(s))
    return train_tokenizer(texts, vocab_size=400)


def test_round_trip_every_symbol_and_tag(tok):
    for text in list(SYMBOLS) + TAGS + ["<think>I am at (0, 1).</think><answer>Up || Left</answer>",
                                        "##√S\n_PXO\n", "unseen wörds ✓ 12345"]:
        assert tok.decode(tok.encode(text)) == text
    for tag in TAGS:
        assert len(tok.encode(tag)) == 1, tag


def test_tags_stay_whole_inside_text(tok):
    ids = tok.encode("x</think><answer>Up</answer>")
    pieces = tok.convert_ids_to_tokens(ids)
    assert "</think>" in pieces and "<answer>" in pieces and "</answer>" in pieces


def test_saved_policy_loads_with_auto_classes_and_rolls_out(tok, tmp_path):
    model = build_tiny_qwen2(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, seed=3)
    save_policy(model, tok, tmp_path, {"note": "test"})
    # a local directory goes through the same path as a hub name would
    cfg = load_config(None, [f"policy.model={tmp_path}"])
    loaded, ltok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    assert str(path) == str(tmp_path) and ltok.padding_side == "left"
    # The loaded tokenizer encodes exactly as trained (AutoTokenizer alone would swap in Qwen2's
    # pre-tokenizer because config.json says qwen2, and split every coordinate differently).
    env = make_env("sokoban", slip=0.0)
    text = env.system_prompt() + env.reset(3) + env.expert_turn("grounded").think
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert ltok.encode(text) == tok.encode(text) == raw.encode(text).ids
    ids = torch.tensor([tok.encode("Board size")])
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    batch = rollout(loaded, ltok, lambda: make_env("frozenlake", slip=0.0), env_seeds=[0],
                    dynamics_seeds=[0], group_ids=[0], sampling=SamplingParams(max_new_tokens=4),
                    generator=torch.Generator().manual_seed(0))
    assert batch.n_turns[0] >= 1


def test_tiny_model_is_seeded(tok):
    kw = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    a, b, c = (build_tiny_qwen2(tok, seed=s, **kw) for s in (0, 0, 1))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def tiny_cfg(tmp_path, *extra):
    return load_config(None, [f"policy.cache_dir={tmp_path}", "policy.hidden_size=32",
                              "policy.num_layers=1", "policy.num_heads=2", "policy.num_kv_heads=1",
                              "policy.intermediate_size=64", "policy.vocab_size=300",
                              "warmstart.steps=3", "warmstart.episodes=8", "warmstart.batch_size=4",
                              *extra])


def test_warmstart_cache_is_keyed_and_reused(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path)
    monkeypatch.setattr(warmstart, "TOKENIZER_EPISODES", 10)
    path = warmstart.embedded_policy_path(cfg.policy, cfg.warmstart, cfg.env)
    meta = json.loads((path / "ragen2_meta.json").read_text())
    assert meta["warmstart"]["steps"] == 3 and meta["params"] > 0
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "qwen2"

    def no_rebuild(*a, **k):
        raise AssertionError("cache was not reused")
    monkeypatch.setattr(warmstart, "build_embedded", no_rebuild)
    assert warmstart.embedded_policy_path(cfg.policy, cfg.warmstart, cfg.env) == path
    # slip and the chosen env do not shape the policy; the warm-start recipe does
    same = tiny_cfg(tmp_path, "env.slip=0.5", "env.name=sokoban")
    assert warmstart.cache_key(same.policy, same.warmstart, same.env) == path.name.split("-")[1]
    other = tiny_cfg(tmp_path, "warmstart.grounded_frac=0.25")
    assert warmstart.cache_key(other.policy, other.warmstart, other.env) != path.name.split("-")[1]


def test_expert_traces_mix_grounded_and_template():
    cfg = load_config(None, ["warmstart.grounded_frac=0.5", "warmstart.envs=[frozenlake]"])
    episodes = warmstart.expert_traces(cfg.warmstart, cfg.env, 200, seed_base=0)
    env = make_env("frozenlake", slip=0.0)
    env.reset(0)
    fixed = env.expert_turn("template").think
    n_template = sum(ep[0][1].startswith(fixed) for ep in episodes)
    assert 70 <= n_template <= 130  # Binomial(200, 0.5): mean 100, sd ~7


def test_scratchpad_enters_the_cache_key_only_when_it_changes_the_traces():
    base = load_config(None)
    path_key = warmstart.cache_key(base.policy, base.warmstart, base.env)
    # The default's key as it was before the field existed (policies cached then stay valid).
    shape = {"version": warmstart.FORMAT_VERSION, "policy": dataclasses.asdict(base.policy),
             "warmstart": dataclasses.asdict(base.warmstart),
             "env": {k: v for k, v in dataclasses.asdict(base.env).items()
                     if k not in ("name", "slip", "val_seeds", "val_seed_start", "math", "code", "doors",
                                  "success_reward", "step_penalty")}}
    del shape["warmstart"]["env"]  # stands for the traces' env, which is the run's when empty
    del shape["policy"]["cache_dir"], shape["policy"]["model"], shape["env"]["frozenlake"]["scratchpad"]
    del shape["policy"]["chat_template"]  # out of the key at auto, for the same reason
    del shape["policy"]["lora"], shape["warmstart"]["init_from"]  # adapters come later; init_from at scratch
    del shape["warmstart"]["grounded_steps"]  # out of the key at 0 (no curriculum)
    del shape["warmstart"]["pretrained"]  # a pretrained model's switch, never in the embedded key
    old = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    assert path_key == old
    base.env.frozenlake.scratchpad = "scan"
    assert warmstart.cache_key(base.policy, base.warmstart, base.env) != path_key


def test_shipped_policy_is_found_without_a_build_and_rebuilt_on_request(tmp_path, monkeypatch):
    monkeypatch.setattr(warmstart, "TOKENIZER_EPISODES", 10)
    built = warmstart.embedded_policy_path(*_sections(tiny_cfg(tmp_path / "maker")))
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / built.name).symlink_to(built)
    monkeypatch.setattr(warmstart, "SHIPPED", shipped)
    cfg = tiny_cfg(tmp_path / "user-cache")  # an empty cache: a fresh clone

    def no_build(*a, **k):
        raise AssertionError("a shipped policy was built again")
    monkeypatch.setattr(warmstart, "build_embedded", no_build)
    assert warmstart.find_policy(*_sections(cfg)) == (shipped / built.name, "shipped")
    assert warmstart.embedded_policy_path(*_sections(cfg)) == shipped / built.name
    assert not (tmp_path / "user-cache").exists()  # nothing written for a shipped policy

    monkeypatch.undo()
    monkeypatch.setattr(warmstart, "TOKENIZER_EPISODES", 10)
    monkeypatch.setattr(warmstart, "SHIPPED", shipped)
    rebuilt = warmstart.embedded_policy_path(*_sections(cfg), rebuild=True)
    assert rebuilt == tmp_path / "user-cache" / built.name
    assert warmstart.find_policy(*_sections(cfg)) == (rebuilt, "cached")  # the user's build comes first
    # the same recipe, the same weights (this is what makes the key, taken from the config, meaningful)
    assert (rebuilt / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()
    # a second rebuild replaces the cached copy in place; no temporary folder is left behind
    assert warmstart.embedded_policy_path(*_sections(cfg), rebuild=True) == rebuilt
    assert sorted(p.name for p in (tmp_path / "user-cache").iterdir()) == [f".{built.name}.lock", built.name]
    # shipping copies the files (not a link into someone's cache) next to the other shipped ones
    copy = warmstart.ship(rebuilt)
    assert copy == shipped / built.name and not copy.is_symlink()
    assert sorted(f.name for f in copy.iterdir()) == sorted(f.name for f in rebuilt.iterdir())
    assert warmstart.find_policy(*_sections(tiny_cfg(tmp_path / "empty")))[1] == "shipped"


def _sections(cfg):
    return cfg.policy, cfg.warmstart, cfg.env


def test_curriculum_builds_its_grounded_stage_first_and_continues_from_it(tmp_path, monkeypatch):
    monkeypatch.setattr(warmstart, "TOKENIZER_EPISODES", 10)
    cfg = tiny_cfg(tmp_path, "warmstart.grounded_steps=2")
    stage = warmstart.grounded_stage(cfg.warmstart)
    assert (stage.grounded_frac, stage.steps, stage.grounded_steps) == (1.0, 2, 0)
    # The stage is the grounded-only policy of the same recipe: one cached policy, one key.
    grounded_only = tiny_cfg(tmp_path, "warmstart.grounded_frac=1.0", "warmstart.steps=2")
    assert warmstart.cache_key(cfg.policy, stage, cfg.env) == warmstart.cache_key(*_sections(grounded_only))
    path = warmstart.embedded_policy_path(*_sections(cfg))
    stage_path = warmstart.find_policy(cfg.policy, stage, cfg.env)
    assert stage_path[1] == "cached"
    meta = json.loads((path / "ragen2_meta.json").read_text())
    assert meta["init_from"] == stage_path[0].name  # continued from the stage, with its tokenizer
    assert meta["warmstart"]["steps"] == 3 and meta["warmstart"]["grounded_frac"] == 0.5
    assert (path / "tokenizer.json").read_bytes() == (stage_path[0] / "tokenizer.json").read_bytes()
    # 0 keeps the keys of policies cached before the field; any other value names another policy.
    assert warmstart.cache_key(*_sections(tiny_cfg(tmp_path))) != path.name.split("-")[1]
    with pytest.raises(ConfigError, match=r"grounded_steps=2 with grounded_frac=1.0: .*set grounded_steps=0"):
        tiny_cfg(tmp_path, "warmstart.grounded_steps=2", "warmstart.grounded_frac=1.0")


def test_rl_time_env_fields_leave_the_key_and_warmstart_env_moves_it():
    """Rewards and slip are RL-time settings (the traces are played at slip 0 and the env's own
    reward scale), so changing them finds the same policy; warmstart.env changes the traces' maps,
    and with them the key, unless it restates the run's env."""
    doors = load_config("sweeps/base/doors.yaml")
    key = warmstart.cache_key(doors.policy, doors.warmstart, doors.env)
    assert key == "02725ad36373"  # the shipped doors policy
    shaped = load_config("sweeps/base/doors.yaml", ["env.success_reward=10", "env.step_penalty=-0.1",
                                                    "env.slip=0.25"])
    assert warmstart.cache_key(shaped.policy, shaped.warmstart, shaped.env) == key
    harder = load_config("sweeps/base/doors.yaml", ["env.doors.min_path_len=5", "env.doors.max_path_len=7"])
    assert warmstart.cache_key(harder.policy, harder.warmstart, harder.env) != key
    pinned = load_config("sweeps/base/doors.yaml", ["env.doors.min_path_len=5", "env.doors.max_path_len=7",
                                                    "warmstart.env.doors.min_path_len=3",
                                                    "warmstart.env.doors.max_path_len=5"])
    assert warmstart.cache_key(pinned.policy, pinned.warmstart, pinned.env) == key


def test_traces_are_played_in_the_warmstart_env():
    cfg = load_config("sweeps/base/doors.yaml", ["env.doors.min_path_len=6", "env.doors.max_path_len=8",
                                                 "warmstart.env.doors.min_path_len=3",
                                                 "warmstart.env.doors.max_path_len=3",
                                                 "env.success_reward=10", "warmstart.grounded_frac=1.0",
                                                 "warmstart.grounded_steps=0"])
    episodes = warmstart.expert_traces(cfg.warmstart, cfg.env, 20, seed_base=0)
    for ep in episodes:
        # A 3-door path is walked in two turns (2 + 1 moves); the second turn's prompt shows the
        # first turn's reward at the env's own scale (0), never the run's success_reward.
        assert len(ep) == 2
        assert "Reward: 0\n" in ep[1][0]
