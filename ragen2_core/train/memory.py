"""How much memory one training step needs, estimated from the config and the model's shape before
anything loads, and whether this machine has it (the training preflight's memory check).

    shape = embedded_shape(cfg.policy)            # or hf_shape(AutoConfig.from_pretrained(name))
    memory_need(cfg, shape)                       # {"kv_cache": bytes, "activations": ..., "logits": ..., "weights": ...}
    memory_problems(cfg, shape)                   # [] when it fits, else one message naming the fields to lower
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

NO_MEMORY_CHECK = "--no-memory-check"


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the memory estimate needs of a model: widths, depth, vocabulary, parameter count."""
    hidden: int
    layers: int
    kv_width: int       # key/value heads x head dimension
    vocab: int
    params: int


def embedded_shape(p) -> Shape:
    head = p.hidden_size // p.num_heads
    return Shape(p.hidden_size, p.num_layers, p.num_kv_heads * head, p.vocab_size,
                 _params(p.vocab_size, p.hidden_size, p.num_layers, p.num_kv_heads * head, p.intermediate_size))


def hf_shape(c) -> Shape:
    get = lambda *names, default=0: next((getattr(c, n) for n in names if getattr(c, n, None)), default)  # noqa: E731
    hidden = get("hidden_size", "n_embd", "d_model", default=1)
    layers = get("num_hidden_layers", "n_layer", "num_layers", default=1)
    heads = get("num_attention_heads", "n_head", default=1)
    kv_width = get("num_key_value_heads", default=heads) * get("head_dim", default=hidden // max(1, heads))
    vocab = get("vocab_size", default=1)
    inter = get("intermediate_size", "n_inner", default=4 * hidden)
    return Shape(hidden, layers, kv_width, vocab, _params(vocab, hidden, layers, kv_width, inter))


def _params(vocab: int, hidden: int, layers: int, kv_width: int, inter: int) -> int:
    attention = hidden * (2 * hidden + 2 * kv_width)           # q, o; k, v
    return vocab * hidden + layers * (attention + 3 * hidden * inter)


BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def memory_need(cfg, shape: Shape) -> dict[str, int]:
    """Bytes of the largest pieces of one training step, from the config alone:

        kv_cache     rows x context x layers x 2 x kv_width x bytes   the rollout's KV cache, all rows at once
        activations  micro x context x hidden x layers x bytes        one stored activation per layer in the update
        logits       micro x chunk x vocab x 4                        one chunk of float32 logits
        weights      parameters x bytes

    rows = rollout.n_groups x rollout.group_size, context = rollout.max_context_tokens (the length long
    episodes reach), micro = rows / (algo.mini_batches x train.grad_accum) rounded up, chunk =
    train.logit_chunk (0: the context). Every other factor is the least the piece takes (a layer keeps
    several activations, Adam two moments per weight), so only a config whose estimate exceeds the
    machine's memory outright is refused."""
    size = BYTES[cfg.policy.dtype]
    rows = cfg.rollout.n_groups * cfg.rollout.group_size
    context = cfg.rollout.max_context_tokens
    micro = -(-rows // (cfg.algo.mini_batches * cfg.train.grad_accum))
    return {"kv_cache": rows * context * shape.layers * 2 * shape.kv_width * size,
            "activations": micro * context * shape.hidden * shape.layers * size,
            "logits": micro * (cfg.train.logit_chunk or context) * shape.vocab * 4,
            "weights": shape.params * size}


def machine_memory() -> int:
    """Bytes of RAM on this machine (MemTotal), plus the first GPU's memory where there is one: the
    most any run here can ever have (on a GPU the KV cache and activations live on the device, so
    host RAM alone would refuse runs that fit)."""
    return _host_memory() + _gpu_memory()


def _host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gpu_memory() -> int:
    if not list(Path("/dev").glob("nvidia[0-9]*")):
        return 0  # no NVIDIA device: torch (seconds to import) is not needed to know it
    import torch
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0


def memory_problems(cfg, shape: Shape, total: int | None = None) -> list[str]:
    need = memory_need(cfg, shape)
    total = machine_memory() if total is None else total
    if sum(need.values()) <= total:
        return []
    rows = cfg.rollout.n_groups * cfg.rollout.group_size
    parts = ", ".join(f"{k.replace('_', ' ')} {_size(v)}" for k, v in need.items())
    return [f"rollout.n_groups x rollout.group_size: {cfg.rollout.n_groups} x {cfg.rollout.group_size} = {rows:,} "
            f"rows of up to rollout.max_context_tokens={cfg.rollout.max_context_tokens} tokens need at least "
            f"{_size(sum(need.values()))} ({parts}; an estimate from the config), more than this machine's "
            f"{_size(total)} of memory; lower rollout.n_groups, rollout.group_size or rollout.max_context_tokens, "
            f"or, if the estimate is wrong for this model, pass {NO_MEMORY_CHECK}"]


def _size(n: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    i = min(len(units) - 1, int(math.log(max(n, 1), 1024)))
    return f"{n / 1024 ** i:.1f} {units[i]}"
