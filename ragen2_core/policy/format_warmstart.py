"""The format warm start of a pretrained policy (``warmstart.pretrained: true``).

A real instruct model shown an env's board writes fluent generic text and never the env's
``<think>...</think><answer>...</answer>`` format, so every group scores alike and RL has no signal
until it stumbles on the format. This is the embedded policy's supervised pass on expert traces
(policy/warmstart.py), but rendered in the model's own chat template, with each reply ending in the
template's end-of-turn token (the ids a rollout yields when the policy closes its turns itself). With
``policy.lora.r > 0`` only adapters train and are merged into the weights before saving, so RL then
starts from an ordinary folder (and puts fresh adapters on it). The warm start's recipe is
``warmstart.{envs, grounded_frac, episodes, steps, batch_size, lr, seed, env}``.

The result is cached under ``<cache_dir>/format-<key>/`` (key: the base model's identity, the
recipe, the template, the adapters' shape), built once and atomically like the embedded policy.

    path = format_policy_path(base_folder, cfg.policy, cfg.warmstart, cfg.env)   # builds on first use
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from ragen2_core.atomic import build_folder_once
from ragen2_core.config import RL_ONLY_ENV_FIELDS, trace_env
from ragen2_core.policy.gguf import MARKER as GGUF_MARKER
from ragen2_core.policy.lora import apply_lora, has_adapters, merged_state_dict
from ragen2_core.policy.model import WEIGHT_FILES, count_parameters, load_pretrained, load_tokenizer
from ragen2_core.policy.warmstart import expert_traces, supervised_pass, tokenize_traces
from ragen2_core.rollout.episodes import single_token_id
from ragen2_core.rollout.prompt import load_prompt_format

MARKER = "ragen2_format_warmstart.json"  # written last into every built folder
VERSION = 1                              # bump when the traces' rendering changes


def base_identity(base: str) -> str:
    """What names the base model's weights: a converted GGUF's hash, a local folder's config and
    weight files (size, mtime), else the hub name."""
    folder = Path(base).expanduser()
    if (folder / GGUF_MARKER).exists():
        return "gguf:" + json.loads((folder / GGUF_MARKER).read_text())["sha256"]
    if folder.is_dir():
        files = sorted({folder / "config.json", *(f for g in WEIGHT_FILES for f in folder.glob(g))})
        stamp = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists()]
        return "dir:" + str(folder.resolve()) + ":" + json.dumps(stamp)
    return "hub:" + base


def format_key(base: str, policy_cfg, warm_cfg, env_cfg, template: str) -> str:
    warm = {k: v for k, v in asdict(warm_cfg).items()
            if k not in ("enabled", "pretrained", "init_from", "grounded_steps", "env")}
    lora = asdict(policy_cfg.lora) if policy_cfg.lora.r else {"r": 0}
    # The traces' env: its common fields and the sections of the envs whose traces are used.
    env = {k: v for k, v in asdict(trace_env(env_cfg, warm_cfg.env)).items()
           if k not in RL_ONLY_ENV_FIELDS and (not isinstance(v, dict) or k in warm_cfg.envs)}
    shape = {"version": VERSION, "base": base_identity(base), "dtype": policy_cfg.dtype, "warmstart": warm,
             "lora": lora, "template_sha256": hashlib.sha256(template.encode()).hexdigest(), "env": env}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:12]


def format_policy_path(base: str, policy_cfg, warm_cfg, env_cfg, rebuild: bool = False) -> Path:
    """The format-warm-started copy of the model at ``base`` (a folder or hub name), built if missing."""
    template = load_prompt_format(load_tokenizer(base), policy_cfg.chat_template)
    text = getattr(template, "template", None) or "raw"
    final = Path(os.path.expanduser(policy_cfg.cache_dir)) / f"format-{format_key(base, policy_cfg, warm_cfg, env_cfg, text)}"

    def build(tmp: Path) -> None:
        print(f"[warmstart] format warm start of {base} -> {final}", flush=True)
        build_format_warmstart(tmp, base, policy_cfg, warm_cfg, env_cfg)

    return build_folder_once(final, MARKER, build, rebuild=rebuild)


def build_format_warmstart(out: Path, base: str, policy_cfg, warm_cfg, env_cfg) -> dict:
    """Supervised steps on the rendered expert traces; saves the (merged) model, tokenizer and marker."""
    t0 = time.time()
    model, tok = load_pretrained(base, dtype=policy_cfg.dtype, cache_dir=policy_cfg.cache_dir)
    prompt_format = load_prompt_format(tok, policy_cfg.chat_template)
    eot = single_token_id(tok, prompt_format.end_of_turn) if prompt_format.end_of_turn else None
    lora = policy_cfg.lora
    if lora.r:
        model = apply_lora(model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout,
                           target_modules=lora.target_modules)
    # Seeds disjoint from validation (as the embedded warm start's).
    episodes = expert_traces(warm_cfg, env_cfg, warm_cfg.episodes, seed_base=10_000_000, prompt_format=prompt_format)
    data = tokenize_traces(episodes, tok, eot=eot)
    losses = supervised_pass(model, data, steps=warm_cfg.steps, batch_size=warm_cfg.batch_size,
                             lr=warm_cfg.lr, seed=warm_cfg.seed, pad_id=tok.pad_token_id,
                             log_every=max(1, warm_cfg.steps // 20))
    if has_adapters(model):
        plain = merged_state_dict(model, model.state_dict())
        model, _ = load_pretrained(base, dtype=policy_cfg.dtype, cache_dir=policy_cfg.cache_dir)
        model.load_state_dict(plain)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    window = losses[-max(1, min(20, len(losses) // 4)):]
    meta = {"base": base, "base_identity": base_identity(base), "params": count_parameters(model),
            "lora_r": lora.r, "warmstart": asdict(warm_cfg), "first_loss": losses[0],
            "final_loss": sum(window) / len(window), "mean_tokens": sum(len(d[0]) for d in data) / len(data),
            "end_of_turn": prompt_format.end_of_turn, "build_seconds": round(time.time() - t0, 1)}
    (out / MARKER).write_text(json.dumps(meta, indent=2, default=str))
    return meta
