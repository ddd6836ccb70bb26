"""Policy construction: the tiny embedded Qwen2 or any HF causal LM, through the same code path.

    model, tok = load_pretrained("Qwen/Qwen2.5-0.5B-Instruct")    # or a local directory, a .gguf file
    model, tok = load_pretrained("smollm2-135m-instruct")         # a GGUF in an installed wheel
    model = build_tiny_qwen2(tok, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                             intermediate_size=384, seed=0)
"""
from __future__ import annotations

import torch
import json
from pathlib import Path

from ragen2_core.policy.gguf import resolve_model
from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM)

EMBEDDED_MARKER = "ragen2_meta.json"  # written beside every embedded policy
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")  # what from_pretrained reads
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_tiny_qwen2(tokenizer, *, hidden_size: int, num_layers: int, num_heads: int,
                     num_kv_heads: int, intermediate_size: int, seed: int,
                     max_positions: int = 4096) -> Qwen2ForCausalLM:
    """Random-init Qwen2 sized to the tokenizer; seeded so the same arguments give the same weights."""
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model


def load_pretrained(name_or_path: str, *, dtype: str = "float32", cache_dir: str = "~/.cache/ragen2"):
    """Load an HF causal LM and its tokenizer by hub name, local directory, or GGUF (a ``.gguf`` file
    or a known name, converted once into ``cache_dir``: policy/gguf.py).

    A tokenizer without a pad token gets its eos as pad; padding goes on the left because the
    rollout engine appends generated tokens on the right."""
    name_or_path = resolve_model(name_or_path, cache_dir)
    tokenizer = load_tokenizer(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=DTYPES[dtype])
    return model, tokenizer


def load_tokenizer(folder_or_name: str):
    """The tokenizer ``load_pretrained`` gives, without the model (of a folder or hub name)."""
    if (Path(folder_or_name) / EMBEDDED_MARKER).exists():
        # AutoTokenizer would see model_type "qwen2" in config.json and impose Qwen2's own
        # pre-tokenizer on our tokenizer.json, silently changing every encoding.
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder_or_name)
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder_or_name)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def save_policy(model, tokenizer, directory, meta: dict, state_dict: dict | None = None) -> None:
    """``save_pretrained`` of both, plus the marker that makes ``load_pretrained`` read our
    tokenizer.json exactly as written. ``state_dict`` overrides the model's own (ZeRO export)."""
    model.save_pretrained(directory, **({"state_dict": state_dict} if state_dict is not None else {}))
    tokenizer.save_pretrained(directory)
    (Path(directory) / EMBEDDED_MARKER).write_text(json.dumps(meta, indent=2, default=str))


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
