"""A LoRA run end to end through DeepSpeed on the tiny embedded policy, KL on: only the adapters
move, the KL to the adapters-off reference starts at exactly 0, checkpoints hold the adapters alone
and resume the same history, the export is the merged model plus the adapters in peft's format."""
import json

import pytest
import torch
from peft import PeftModel

from ragen2_core.policy.load import resolve_policy_path
from ragen2_core.policy.model import load_pretrained
from ragen2_core.tracking import MemorySink
from ragen2_core.train.trainer import run
from tiny import cfg_for

LORA = ["policy.lora.r=4", "policy.lora.alpha=8", "algo.kl_coef=0.05", "algo.kl_placement=in_loss",
        "collapse.every=0", "train.zero_stage=2", "algo.actor_lr=1e-2"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("policy-cache")


def test_lora_run_trains_adapters_only(tmp_path, cache):
    cfg = cfg_for(tmp_path, cache, "train.steps=2", "train.checkpoint_every=1", *LORA)
    sink = MemorySink()
    result = run(cfg, sink)
    assert result["stop_reason"] == "completed"
    # KL against the base with adapters off, measured before the first optimizer step.
    first = dict(sink.metrics)[1]
    assert first["actor/kl"] == pytest.approx(0.0, abs=1e-7)
    assert dict(sink.metrics)[2]["actor/kl"] > 0          # the adapters moved the policy

    # Checkpoints hold the trainable part only, plus the output head: DeepSpeed drops frozen
    # parameters by their first name, and the tied head is the (frozen) input embedding's second.
    ckpt = sorted((tmp_path / "checkpoints").glob("step_*"))[-1] / "actor" / "state"
    states = torch.load(next(ckpt.glob("*model_states.pt")), weights_only=False)
    assert states["module"] and [k for k in states["module"] if ".lora_" not in k] == ["lm_head.weight"]

    # Export: merged weights differ from the start only by the adapters' B A; nothing else moved.
    start, _ = load_pretrained(resolve_policy_path(cfg.policy, cfg.warmstart, cfg.env))
    merged, _ = load_pretrained(tmp_path / "policy")
    wrapped = PeftModel.from_pretrained(load_pretrained(resolve_policy_path(cfg.policy, cfg.warmstart, cfg.env))[0],
                                        tmp_path / "policy" / "adapter")
    adapted = {n.split(".base_layer.")[0].removeprefix("base_model.model.") for n, _ in wrapped.named_parameters()
               if ".base_layer." in n}
    start_sd, merged_sd = start.state_dict(), merged.state_dict()
    moved = [k for k in start_sd if not torch.equal(start_sd[k], merged_sd[k])]
    assert moved and all(k.rsplit(".", 1)[0] in adapted for k in moved), moved
    ids = torch.randint(1, 100, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, wrapped(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert json.loads((tmp_path / "policy" / "adapter" / "adapter_config.json").read_text())["r"] == 4


def test_lora_resume_continues_the_same_history(tmp_path, cache):
    whole = MemorySink()
    run(cfg_for(tmp_path / "whole", cache, "train.steps=2", *LORA), whole)
    part = MemorySink()
    run(cfg_for(tmp_path / "part", cache, "train.steps=1", "train.checkpoint_every=1", *LORA), MemorySink())
    run(cfg_for(tmp_path / "part", cache, "train.steps=2", "train.resume=true", *LORA), part)
    a, b = dict(whole.metrics)[2], dict(part.metrics)[2]
    for k in ("actor/kl", "actor/pg_loss", "actor/grad_norm", "rollout/reward"):
        if k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k
