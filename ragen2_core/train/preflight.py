"""Checks a command makes before its first side effect (output folder, MLflow store and run, process
group, DeepSpeed): each problem is one message naming the field or file, the bad value and the fix.

    problems = preflight(cfg)                          # `ragen2 train`: [] when the run may start, else exit 2
    problems = config_problems(cfg, cache={})          # one trial's config (the sweep driver, per trial)
    problems = eval_preflight(cfg)                     # `ragen2 eval`; warmstart_preflight, report_problems alike

Covered: the policy loads (its config and tokenizer are read, its weight files found, no weights
loaded); the batch fits the machine's memory (``train/memory.py``, an estimate from the config; skip
it with ``--no-memory-check``); the env can be built as configured (data files exist, are under the
size cap of ``envs/math.py`` and parse; the code sandbox is available); ``algo.kl_reference`` names
a policy that exists; the tracking URI has a scheme MLflow stores runs under and a local store is
writable, and output folders are writable and not inside a git directory (``outputs.py``); no stale lock blocks
DeepSpeed's op builds under the torch extensions cache (a build killed half-way leaves one, and
every later start would wait on it forever). Seeds are bounded by the config schema itself.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from ragen2_core.outputs import output_problems, resolve_tracking, scheme_problem, tracking_problems
from ragen2_core.train.memory import Shape, embedded_shape, hf_shape, memory_problems

STALE_LOCK_S = 600.0     # a build of DeepSpeed's ops takes a minute or two; a lock this old is orphaned
LOCK_WAIT_S = 20.0       # a younger lock may be a concurrent build: wait this long for it to go


def preflight(cfg, *, memory_check: bool = True) -> list[str]:
    """Everything ``ragen2 train`` needs before it creates anything."""
    uri, label = resolve_tracking(cfg.tracking.uri)
    return (config_problems(cfg, memory_check=memory_check) + tracking_problems(uri, label)
            + build_lock_problems())


def config_problems(cfg, *, memory_check: bool = True, cache: dict | None = None,
                    check_output: bool = True) -> list[str]:
    """What one training config needs: its output folder, policy, memory, env and KL reference.
    ``cache`` memoises the policy and env checks across the trials of a sweep, whose storage folder,
    checked once, holds every trial's output folder (``check_output=False``)."""
    cache = {} if cache is None else cache
    key = ("policy", repr(cfg.policy), repr(cfg.warmstart), repr(cfg.env))  # the embedded policy's key reads all three
    shape, found = _memo(cache, key, lambda: policy_problems(cfg))
    problems = output_problems(cfg.train.output_dir, "train.output_dir") if check_output else []
    problems += found
    if memory_check and shape is not None:
        problems += memory_problems(cfg, shape)
    problems += _memo(cache, ("env", repr(cfg.env)), lambda: (None, _env_problems(cfg)))[1]
    return problems + _reference_problems(cfg)


def eval_preflight(cfg) -> list[str]:
    """``ragen2 eval``: the policy loads and the env builds (it writes nothing but a policy it builds)."""
    return policy_problems(cfg)[1] + _env_problems(cfg)


def warmstart_preflight(cfg) -> list[str]:
    """``ragen2 warmstart``: the policy cache is writable and every env of ``warmstart.envs`` builds."""
    if cfg.policy.model != "embedded":
        return policy_problems(cfg)[1]  # a GGUF is converted; a format warm start checked
    from ragen2_core.config import trace_env

    return (output_problems(cfg.policy.cache_dir, "policy.cache_dir")
            + env_problems(trace_env(cfg.env, cfg.warmstart.env), cfg.warmstart.envs))


def report_problems(uri: str, outputs: dict[str, str | None]) -> list[str]:
    """``ragen2 report``: a tracking URI of a known scheme, output folders ({flag: path}) outside git."""
    problem = scheme_problem(uri, "--tracking-uri")
    problems = [problem] if problem else []
    for flag, path in outputs.items():
        problems += output_problems(path, flag, is_file=flag == "--out") if path else []
    out = outputs.get("--out")
    if out and Path(out).suffix.lower() != ".pdf":
        # the tables go beside it, named after its stem: another suffix would hide what the file is
        problems.append(f"--out {out}: the report is a PDF; name it *.pdf, e.g. --out {Path(out).with_suffix('.pdf')}")
    return problems


def _memo(cache: dict, key: tuple, compute):
    if key not in cache:
        cache[key] = compute()
    return cache[key]


# ----------------------------------------------------------------------------- env, reference

def _env_problems(cfg) -> list[str]:
    return env_problems(cfg.env, [cfg.env.name])


def env_problems(env_cfg, names) -> list[str]:
    """The envs ``names`` (e.g. ``warmstart.envs``) can be built from ``env_cfg``."""
    from ragen2_core.envs.registry import env_factory

    problems = []
    for name in names:
        try:
            env_factory(env_cfg, name)()
        except (ValueError, OSError, RuntimeError) as e:  # bad data file, missing file, no sandbox
            problems.append(f"env.{name}: {e}")
    return problems


def _reference_problems(cfg) -> list[str]:
    if cfg.algo.kl_reference == "init":
        return []
    from ragen2_core.policy.load import reference_path
    try:
        reference_path(cfg.algo.kl_reference, cfg.policy)
    except ValueError as e:
        return [str(e)]
    return []


# ----------------------------------------------------------------------------- the policy

def policy_problems(cfg) -> tuple[Shape | None, list[str]]:
    """(shape, problems) of ``policy.model``: the embedded policy's shape comes from the config (a
    missing one is built into ``policy.cache_dir``, which must then be writable); any other model's
    config and tokenizer are read, its weights only located."""
    if cfg.policy.model == "embedded":
        from ragen2_core.policy.warmstart import find_policy

        missing = find_policy(cfg.policy, cfg.warmstart, cfg.env)[1] == "missing"
        return embedded_shape(cfg.policy), output_problems(cfg.policy.cache_dir, "policy.cache_dir") if missing else []
    from ragen2_core.policy.gguf import GGUFError, resolve_model
    from ragen2_core.policy.model import WEIGHT_FILES

    fix = ("give a folder that save_pretrained wrote (config.json, the tokenizer's files, the weights), "
           "an HF model name, a .gguf file, or embedded")
    try:  # a GGUF is converted here, once, so that trials find the folder ready
        name = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    except GGUFError as e:
        return None, [f"policy.model: {e}"]
    folder = Path(name)  # as load_pretrained reads it: no ~ expansion
    if folder.is_dir() and not any(next(folder.glob(g), None) for g in WEIGHT_FILES):
        return None, [f"policy.model: the folder {name!r} holds no weights (model.safetensors or "
                      f"pytorch_model.bin); {fix}"]
    try:
        config = _read_config_and_tokenizer(name)
    except Exception as e:  # noqa: BLE001 - any failure to read a user's model folder is this answer
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return None, [f"policy.model: cannot load {name!r} ({type(e).__name__}: {first}); {fix}"]
    return hf_shape(config), _format_warmstart_problems(cfg)


def _format_warmstart_problems(cfg) -> list[str]:
    """A pretrained model's format warm start (built at the first load) has its traces and a cache."""
    if not (cfg.warmstart.enabled and cfg.warmstart.pretrained):
        return []
    from ragen2_core.config import trace_env
    return (output_problems(cfg.policy.cache_dir, "policy.cache_dir")
            + env_problems(trace_env(cfg.env, cfg.warmstart.env), cfg.warmstart.envs))


def _read_config_and_tokenizer(name: str):
    from transformers import AutoConfig

    from ragen2_core.policy.model import load_tokenizer

    config = AutoConfig.from_pretrained(name)
    load_tokenizer(name)  # the tokenizer load_pretrained reads, so what loads here loads there
    return config


# ----------------------------------------------------------------------------- DeepSpeed's build locks

def extensions_root() -> Path:
    """Where torch builds C++ extensions (DeepSpeed's ops): $TORCH_EXTENSIONS_DIR or torch's default."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def build_lock_problems(root: Path | None = None, wait_s: float = LOCK_WAIT_S) -> list[str]:
    """torch's FileBaton locks (``<root>/<python tag>/<op>/lock``) that stay: older than
    STALE_LOCK_S at once, younger ones after waiting up to ``wait_s`` for them to go."""
    root = extensions_root() if root is None else Path(root)
    deadline = time.monotonic() + wait_s
    while True:
        locks = [p for p in (*root.glob("*/lock"), *root.glob("*/*/lock")) if p.exists()]
        now = time.time()
        stale = [p for p in locks if now - _mtime(p) > STALE_LOCK_S]
        if stale or not locks or time.monotonic() >= deadline:
            return [f"{p}: a lock left by a C++ extension build that did not finish ({now - _mtime(p):.0f} s "
                    "old), so starting DeepSpeed would wait on it forever; if no other training run is "
                    f"building ops now, delete it (rm {p}) and start again" for p in (stale or locks)]
        time.sleep(0.5)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return time.time()
