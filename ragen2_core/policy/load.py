"""One entry point for every policy: ``policy.model = embedded`` or an HF name / local path, with
LoRA adapters injected when ``policy.lora.r > 0``.

    model, tok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
"""
from __future__ import annotations

from pathlib import Path

from ragen2_core.policy.lora import apply_lora
from ragen2_core.policy.model import load_pretrained
from ragen2_core.policy.warmstart import embedded_policy_path


def resolve_policy_path(policy_cfg, warm_cfg, env_cfg) -> str:
    if policy_cfg.model == "embedded":
        return str(embedded_policy_path(policy_cfg, warm_cfg, env_cfg))
    return policy_cfg.model


def load_policy(policy_cfg, warm_cfg, env_cfg):
    """(model, tokenizer, path). The embedded default is built and cached on first use."""
    path = resolve_policy_path(policy_cfg, warm_cfg, env_cfg)
    model, tok = load_pretrained(path, dtype=policy_cfg.dtype)
    lora = policy_cfg.lora
    if lora.r:
        model = apply_lora(model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout,
                           target_modules=lora.target_modules)
    return model, tok, Path(path) if Path(path).exists() else path
