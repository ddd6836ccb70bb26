"""LoRA adapters through peft, injected into the HF model itself.

peft's ``inject_adapter_in_model`` puts the adapter layers into the model without a ``PeftModel``
wrapper, so the policy keeps its own forward (its KV-cache argument, ``logits_to_keep``) and every
part of the loop (rollout, scoring, the chunked output head) runs on it unchanged. Only the
adapters require gradients, so DeepSpeed builds optimizer state for them alone.

    model = apply_lora(model, r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
    base = AdaptersOff(model)           # the model before training: same weights, adapters bypassed
    plain = merged_state_dict(model, model.state_dict())   # W + (alpha / r) B A under plain HF names
    save_adapter(model, model.state_dict(), "out/adapter") # PeftModel.from_pretrained(base, "out/adapter")

The reference policy of a KL term is the base model, which is exactly this model with its adapters
switched off (TRL's GRPOTrainer does the same with ``model.disable_adapter()`` when given a peft
model): no second copy of the weights is held.
"""
from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch

ADAPTER = "default"   # peft's adapter name; one adapter per policy
# peft is imported inside the functions: it takes seconds, and only LoRA runs need it.


def apply_lora(model: torch.nn.Module, *, r: int, alpha: float, dropout: float,
               target_modules: list[str]) -> torch.nn.Module:
    """Inject LoRA adapters (B = 0 at start, so the model's outputs are unchanged) and freeze
    everything else. Raises ValueError naming `policy.lora.target_modules` when a listed name
    matches no module."""
    from peft import LoraConfig, inject_adapter_in_model
    leaf_names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
    missing = [t for t in target_modules if t not in leaf_names]
    if missing:
        linear = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"policy.lora.target_modules: {missing} match no module of this model; "
                         f"its linear layers are {linear}")
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                        bias="none")
    model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def has_adapters(model: torch.nn.Module) -> bool:
    return any(f".lora_A.{ADAPTER}." in name for name, _ in model.named_parameters())


def _layers(model: torch.nn.Module) -> dict:
    """name -> peft LoRA layer."""
    from peft.tuners.lora import LoraLayer
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Inside, every LoRA layer passes its input through the base layer only."""
    layers = list(_layers(model).values())
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)
        # enable_adapters(True) marks the adapters trainable again: only they were, so nothing else moves.


class AdaptersOff(torch.nn.Module):
    """The base model behind a LoRA model, as a module: its forward runs the LoRA model with the
    adapters switched off. No weights are copied; the signature is the wrapped forward's, so
    callers that inspect it (the KV-cache argument's name) see the model's own."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config

        @functools.wraps(model.forward)
        def forward(*args, **kwargs):
            with adapters_disabled(self.model):
                return self.model(*args, **kwargs)
        self.forward = forward

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()


def merged_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (the LoRA model's state dict, any dtype) as the plain model's: each adapted layer's
    weight becomes W + scaling * B @ A (computed in float32) under its plain name, adapter tensors
    are dropped. Loads with ``AutoModelForCausalLM.from_pretrained``."""
    out = dict(state)
    for name, layer in _layers(model).items():
        base = out.pop(f"{name}.base_layer.weight")
        a, b = out.pop(f"{name}.lora_A.{ADAPTER}.weight"), out.pop(f"{name}.lora_B.{ADAPTER}.weight")
        delta = layer.scaling[ADAPTER] * (b.float() @ a.float())
        out[f"{name}.weight"] = (base.float() + delta).to(base.dtype)
        if f"{name}.base_layer.bias" in out:
            out[f"{name}.bias"] = out.pop(f"{name}.base_layer.bias")
    return out


def plain_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's current weights under the plain architecture's names: merged when it has
    adapters, its state dict otherwise (what an engine that knows no LoRA, e.g. vLLM, loads)."""
    state = model.state_dict()
    return merged_state_dict(model, state) if has_adapters(model) else state


def save_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor], directory: str | Path) -> None:
    """The adapters alone in peft's format (adapter_model.safetensors + adapter_config.json), taken
    from `state` (e.g. the optimizer's float32 masters), loadable by ``PeftModel.from_pretrained``."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lora_state = {k: v for k, v in state.items() if ".lora_" in k}
    tensors = get_peft_model_state_dict(model, state_dict=lora_state, adapter_name=ADAPTER)
    # PeftModel.from_pretrained wraps the base as base_model.model.<name>.
    save_file({f"base_model.model.{k}": v.contiguous() for k, v in tensors.items()},
              str(directory / "adapter_model.safetensors"))
    model.peft_config[ADAPTER].save_pretrained(str(directory))
