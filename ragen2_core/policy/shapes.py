"""Random-init models with the config of a real checkpoint, built offline (tests, benchmarks).

Same config fields as the published Qwen2.5 checkpoints (rope base, norm epsilon, tied embeddings,
grouped-query attention with 2 key/value heads, no sliding window); ``tiny`` keeps that shape at
a size that runs in the default test tier (head size 32, the smallest vLLM's CPU attention takes).

    model = random_qwen25("0.5B", vocab_size=151_936)              # Qwen2.5-0.5B's architecture
    path = save_random_qwen25(tmp / "qwen", "tiny", tokenizer)     # a directory load_pretrained reads
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

QWEN25 = {  # hidden, MLP width, layers, attention heads (config.json of Qwen2.5-*-Instruct)
    "tiny": dict(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4),
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    "3B": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16),
}


def qwen25_config(size: str, *, vocab_size: int = 151_936, pad_token_id: int | None = None,
                  eos_token_id: int | None = None) -> Qwen2Config:
    if size not in QWEN25:
        raise ValueError(f"unknown Qwen2.5 size {size!r}; use one of {', '.join(QWEN25)}")
    dims = QWEN25[size]
    return Qwen2Config(
        vocab_size=vocab_size, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=None, max_window_layers=dims["num_hidden_layers"], attention_dropout=0.0,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=None, **dims)


def random_qwen25(size: str, *, vocab_size: int = 151_936, seed: int = 0, dtype=torch.float32,
                  tokenizer=None) -> Qwen2ForCausalLM:
    """A seeded random-init Qwen2.5 of ``size``; with ``tokenizer`` its pad/eos ids go in the config."""
    ids = {} if tokenizer is None else dict(pad_token_id=tokenizer.pad_token_id,
                                            eos_token_id=tokenizer.eos_token_id)
    config = qwen25_config(size, vocab_size=vocab_size, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.to(dtype)


def save_random_qwen25(directory, size: str, tokenizer, *, vocab_size: int | None = None,
                       seed: int = 0) -> Path:
    """Save a random-init Qwen2.5 with ``tokenizer`` as an HF model directory (no embedded marker, so
    it loads the way a downloaded checkpoint does). The vocabulary defaults to the tokenizer's."""
    model = random_qwen25(size, vocab_size=vocab_size or len(tokenizer), seed=seed, tokenizer=tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)
