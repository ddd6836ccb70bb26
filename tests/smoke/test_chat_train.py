"""Training end to end in a chat template: the embedded policy warm-started in ChatML, and a
random-init model of Qwen2.5's config shape loaded from an HF directory whose tokenizer carries the
template (``chat_template: auto``, as a downloaded Qwen would). Seconds each: plumbing, not learning."""
import json

import pytest

from ragen2_core import mi_offline
from ragen2_core.policy.model import load_pretrained
from ragen2_core.policy.shapes import save_random_qwen25
from ragen2_core.policy.tokenizer import train_tokenizer
from ragen2_core.policy.warmstart import expert_episode
from ragen2_core.envs.registry import make_env
from ragen2_core.rollout.dump import load_rollouts
from ragen2_core.rollout.prompt import ChatFormat, load_prompt_format, template_markers
from ragen2_core.tracking import MemorySink
from ragen2_core.train.trainer import run
from tiny import cfg_for

CHATML = "ragen2_core/policy/templates/chatml.jinja"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("chat-cache")


def test_embedded_policy_trains_in_chatml_and_mi_renders_the_same(tmp_path, cache, capsys):
    sink = MemorySink()
    result = run(cfg_for(tmp_path, cache, "train.steps=2", f"policy.chat_template={CHATML}",
                         "collapse.every=1", "collapse.dump_rollouts=true", "collapse.n_prompts=2",
                         "stops.mi_alert_action=warn"), sink)
    assert result["steps_done"] == 2
    assert all(k in sink.metrics[-1][1] for k in ("actor/pg_loss", "collapse/mi_zscore", "eval/success"))
    # The exported policy carries its template, so `auto` renders it the same way later.
    model, tok = load_pretrained(result["policy_dir"])
    prompt_format = load_prompt_format(tok, "auto")
    assert isinstance(prompt_format, ChatFormat) and prompt_format.end_of_turn == "<|im_end|>"
    eps = load_rollouts(tmp_path / "rollouts.jsonl")
    for e in eps:
        assert e["context"].startswith("<|im_start|>system\n") and e["context"].endswith("assistant\n<think>")
        # `ragen2 mi` re-renders the prompt from the stored messages: the very ids the run scored.
        assert tok.encode(prompt_format.start(e["system"], e["user"]).text, add_special_tokens=False) == e["context_ids"]
    capsys.readouterr()
    for flag in ([], ["--ids"]):
        assert mi_offline.main(["--rollouts", str(tmp_path / "rollouts.jsonl"), "--model", result["policy_dir"],
                                "--n-prompts", "2", "--k-samples", "2", "--n-perm", "4", *flag]) == 0
        assert "mi_zscore" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_qwen25_shaped_model_with_its_own_chatml_tokenizer_trains(tmp_path, cache):
    template = open(CHATML).read()
    env = make_env("frozenlake", slip=0.0)
    texts = [p + r for s in range(40) for p, r in expert_episode(env, s, "grounded")]
    tok = train_tokenizer(texts, vocab_size=400, specials=template_markers(template))
    tok.chat_template = template
    path = save_random_qwen25(tmp_path / "qwen-tiny", "tiny", tok)
    sink = MemorySink()
    result = run(cfg_for(tmp_path / "run", cache, "train.steps=2", f"policy.model={path}"), sink)
    assert result["steps_done"] == 2 and "actor/pg_loss" in sink.metrics[-1][1]
    samples = [t for name, t in sink.texts.items() if name.startswith("samples/")]
    assert samples and all("<|im_start|>assistant\n<think>" in t for t in samples)
