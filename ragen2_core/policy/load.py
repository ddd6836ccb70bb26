"""One entry point for every policy: ``policy.model = embedded``, an HF name / local path, or a GGUF
(a ``.gguf`` file or a known name such as ``smollm2-135m-instruct``: policy/gguf.py); a pretrained
model is format-warm-started first with ``warmstart.pretrained`` (policy/format_warmstart.py); LoRA
adapters are injected when ``policy.lora.r > 0``.

    model, tok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    ref = load_reference(cfg.algo.kl_reference, cfg.policy, tok)   # None for "init"
"""
from __future__ import annotations

from pathlib import Path

from ragen2_core.policy.gguf import GGUFError, is_gguf, resolve_model
from ragen2_core.policy.lora import apply_lora
from ragen2_core.policy.model import EMBEDDED_MARKER, load_pretrained
from ragen2_core.policy.warmstart import SHIPPED, embedded_policy_path


def resolve_policy_path(policy_cfg, warm_cfg, env_cfg) -> str:
    if policy_cfg.model == "embedded":
        return str(embedded_policy_path(policy_cfg, warm_cfg, env_cfg))
    base = resolve_model(policy_cfg.model, policy_cfg.cache_dir)
    if warm_cfg.enabled and warm_cfg.pretrained:
        from ragen2_core.policy.format_warmstart import format_policy_path
        return str(format_policy_path(base, policy_cfg, warm_cfg, env_cfg))
    return base


def load_policy(policy_cfg, warm_cfg, env_cfg):
    """(model, tokenizer, path). The embedded default is built and cached on first use."""
    path = resolve_policy_path(policy_cfg, warm_cfg, env_cfg)
    model, tok = load_pretrained(path, dtype=policy_cfg.dtype)
    lora = policy_cfg.lora
    if lora.r:
        model = apply_lora(model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout,
                           target_modules=lora.target_modules)
    return model, tok, Path(path) if Path(path).exists() else path


def reference_path(name: str, policy_cfg) -> Path:
    """Where ``algo.kl_reference`` (a path, or ``embedded-<key>``) is; ValueError naming the fix."""
    if is_gguf(name):
        try:
            return Path(resolve_model(name, policy_cfg.cache_dir))
        except GGUFError as e:
            raise ValueError(f"algo.kl_reference: {e}") from None
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    if name.startswith("embedded-"):
        for root in (Path(policy_cfg.cache_dir).expanduser(), SHIPPED):
            if (root / name / EMBEDDED_MARKER).exists():
                return root / name
    raise ValueError(f"algo.kl_reference: {name!r} is neither a directory, a GGUF nor an embedded-<key> policy in "
                     f"{policy_cfg.cache_dir} or {SHIPPED}; give init, a policy folder, or build it first "
                     "(ragen2 warmstart --config ... with the recipe that names it)")


def load_reference(name: str, policy_cfg, tok):
    """The KL reference model for ``algo.kl_reference``, or None for init (the trainer then copies
    the starting policy). Its tokenizer must be the policy's: the KL compares the two models'
    log-probs of the same token ids."""
    if name == "init":
        return None
    path = reference_path(name, policy_cfg)
    model, ref_tok = load_pretrained(str(path), dtype=policy_cfg.dtype)
    if ref_tok.get_vocab() != tok.get_vocab():
        raise ValueError(f"algo.kl_reference: {str(path)!r} has another tokenizer than the policy, so the two "
                         "models' log-probs of one token sequence are not comparable; give a policy trained "
                         "from the same tokenizer")
    return model
