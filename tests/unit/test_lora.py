"""LoRA through peft: only adapters train, the adapters-off model is the base exactly (so a KL
term against it is zero at the start), the merged export and the peft-format adapter reproduce the
trained model."""
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ragen2_core.algo.losses import HeadLogits
from ragen2_core.policy.lora import AdaptersOff, apply_lora, has_adapters, merged_state_dict, save_adapter
from ragen2_core.rollout.sampler import cache_kwarg
from ragen2_core.train.shared_prefix import forward_window
from ragen2_core.train.scoring import score_tokens

TARGETS = ["q_proj", "v_proj", "down_proj"]


def base_model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).eval()


def batch():
    torch.manual_seed(1)
    ids = torch.randint(1, 60, (3, 9))
    attn = torch.ones_like(ids)
    attn[1, 6:] = 0
    return ids, attn


def trained_lora():
    """A LoRA model whose adapters moved (B != 0), and the untouched base it started from."""
    base = base_model()
    model = apply_lora(copy.deepcopy(base), r=4, alpha=8.0, dropout=0.0, target_modules=TARGETS)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.5)
    return model, base


def test_only_adapters_train_and_outputs_start_unchanged():
    base = base_model()
    model = apply_lora(copy.deepcopy(base), r=4, alpha=8.0, dropout=0.0, target_modules=TARGETS)
    assert has_adapters(model) and not has_adapters(base)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    # 2 layers x 3 targets x (A, B)
    assert len(trainable) == 12 and all(".lora_" in n for n in trainable)
    ids, attn = batch()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=attn).logits,
                           base(input_ids=ids, attention_mask=attn).logits)   # B = 0 adds exactly 0
    assert cache_kwarg(AdaptersOff(model)) == cache_kwarg(model)


def test_bad_target_module_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"policy.lora.target_modules: \['qproj'\].*q_proj"):
        apply_lora(base_model(), r=4, alpha=8.0, dropout=0.0, target_modules=["qproj"])


def test_adapters_off_is_the_base_and_kl_is_zero_at_the_start():
    ids, attn = batch()
    t = {"input_ids": ids, "attention_mask": attn}
    # At the start (B = 0) the policy and its adapters-off reference give identical log-probs,
    # so every KL estimator is exactly 0.
    fresh = apply_lora(base_model(), r=4, alpha=8.0, dropout=0.0, target_modules=TARGETS)
    for chunk in (0, 4):
        lp, _ = score_tokens(fresh, t, micro=2, logit_chunk=chunk)
        ref, _ = score_tokens(AdaptersOff(fresh), t, micro=2, logit_chunk=chunk)
        assert torch.equal(lp, ref)
    # After training the adapters, the reference is still the base model, with no copy held.
    model, base = trained_lora()
    ref = AdaptersOff(model)
    with torch.no_grad():
        expect = base(input_ids=ids, attention_mask=attn).logits
        torch.testing.assert_close(ref(input_ids=ids, attention_mask=attn).logits, expect, atol=1e-6, rtol=0)
        assert (model(input_ids=ids, attention_mask=attn).logits - expect).abs().max() > 1e-2
    assert {p.data_ptr() for p in ref.parameters()} <= {p.data_ptr() for p in model.parameters()}
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n)  # restored after use
    logits, _ = forward_window(ref, ids, attn, logit_chunk=4)
    assert isinstance(logits, HeadLogits)   # the reference scores through the chunked head too


def test_merged_export_and_peft_adapter_reproduce_the_model(tmp_path):
    from peft import PeftModel
    model, base = trained_lora()
    ids, attn = batch()
    with torch.no_grad():
        expect = model(input_ids=ids, attention_mask=attn).logits
    merged = merged_state_dict(model, model.state_dict())
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    model.save_pretrained(tmp_path / "plain", state_dict=merged)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    save_adapter(model, model.state_dict(), tmp_path / "adapter")
    wrapped = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids, attention_mask=attn).logits, expect, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(wrapped(input_ids=ids, attention_mask=attn).logits, expect, atol=1e-5, rtol=1e-5)
