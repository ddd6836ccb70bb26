"""Checks a command makes before its first side effect (output folder, MLflow store and run, process
group, DeepSpeed): each problem is one message naming the field or file, the bad value and the fix.

    problems = preflight(cfg)                          # `ragen2 train`: [] when the run may start, else exit 2
    problems = config_problems(cfg, cache={})          # one trial's config (the sweep driver, per trial)
    problems = tracking_problems(uri, "--tracking-uri")
    problems = output_problems("runs/x", "train.output_dir")

Covered: the policy loads (its config and tokenizer are read, its weight files found, no weights
loaded); the batch fits the machine's memory (``memory_need``, an estimate from the config; skip it
with ``--no-memory-check``); the env can be built as configured (data files exist, are under the
size cap of ``envs/math.py`` and parse; the code sandbox is available); ``algo.kl_reference`` names
a policy that exists; the tracking URI has a scheme MLflow stores runs under and a local store is
writable; output folders are writable and not inside a git directory; no stale lock blocks
DeepSpeed's op builds under the torch extensions cache (a build killed half-way leaves one, and
every later start would wait on it forever). Seeds are bounded by the config schema itself.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from urllib.parse import urlparse

STALE_LOCK_S = 600.0     # a build of DeepSpeed's ops takes a minute or two; a lock this old is orphaned
LOCK_WAIT_S = 20.0       # a younger lock may be a concurrent build: wait this long for it to go
NO_MEMORY_CHECK = "--no-memory-check"
# The URI schemes MLflow 3 registers a tracking store for ('' is a plain folder).
TRACKING_SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks",
                    "databricks-uc", "uc")


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

@dataclasses.dataclass(frozen=True)
class Shape:
    """What the memory estimate needs of a model: widths, depth, vocabulary, parameter count."""
    hidden: int
    layers: int
    kv_width: int       # key/value heads x head dimension
    vocab: int
    params: int


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


# ----------------------------------------------------------------------------- memory

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


# ----------------------------------------------------------------------------- tracking, folders

def resolve_tracking(uri: str | None) -> tuple[str, str]:
    """(the URI a run will use, what set it) for messages that name the setting to change."""
    from ragen2_core.tracking.mlflow_sink import default_tracking_uri

    if uri:
        return uri, "tracking.uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    return default_tracking_uri(), "the default MLflow store"


def tracking_problems(uri: str, label: str = "tracking.uri") -> list[str]:
    """The MLflow store ``uri`` can take runs: a scheme MLflow stores runs under and, for a local store
    (sqlite file or folder), a place this process may write. A server is not contacted."""
    scheme = _scheme(uri)
    if scheme not in TRACKING_SCHEMES:
        return [scheme_problem(uri, label)]
    path = _local_store(uri, scheme)
    problem = _unwritable(path, "store", is_file=scheme == "sqlite") if path else None
    return [f"{label}: {uri!r}: {problem}; give a store in a writable folder, e.g. "
            f"--tracking-uri sqlite:///{Path.cwd() / 'mlflow.db'}"] if problem else []


def store_problems(uri: str, label: str = "--tracking-uri") -> list[str]:
    """For commands that only read a store (``ragen2 ui``): a known scheme, and a local store that
    exists, since MLflow would create an empty one on opening it."""
    scheme = _scheme(uri)
    if scheme not in TRACKING_SCHEMES:
        return [scheme_problem(uri, label)]
    path = _local_store(uri, scheme)
    if path is None or path.exists():
        return []
    return [f"{label}: no MLflow store at {path} (from {uri!r}), so nothing has been recorded there; train or "
            "run a sweep first, or pass --tracking-uri of the store they wrote (e.g. sqlite:////abs/path/mlflow.db)"]


def scheme_problem(uri: str, label: str) -> str | None:
    scheme = _scheme(uri)
    if scheme in TRACKING_SCHEMES:
        return None
    return (f"{label}: {uri!r} has the scheme {scheme}://, which MLflow keeps no runs under; use "
            "sqlite:///path/mlflow.db (the default), a folder, http(s)://host:port of a tracking server, "
            "or a postgresql://, mysql:// or mssql:// database")


def _scheme(uri: str) -> str:
    return urlparse(uri).scheme.split("+")[0].lower()


def _local_store(uri: str, scheme: str) -> Path | None:
    if scheme == "sqlite":
        rest = uri.split("://", 1)[1]
        path = rest[1:].split("?", 1)[0] if rest.startswith("/") else ""
        return Path(path) if path and path != ":memory:" else None
    if scheme in ("", "file"):
        return Path(urlparse(uri).path if scheme else uri).expanduser()
    return None


def output_problems(path, field: str, is_file: bool = False) -> list[str]:
    """``path`` can be an output folder (or file): not inside a git directory, creatable or writable."""
    where = Path(path).expanduser()
    git = _git_dir_around(where)
    if git is not None:
        return [f"{field}: {str(path)!r} lies inside the git directory {git}, where git keeps the repository "
                "itself (outputs there can corrupt it or vanish with it); choose a folder outside it"]
    problem = _unwritable(where, "file" if is_file else "folder", is_file=is_file)
    return [f"{field}: {str(path)!r}: {problem}; choose another {'path' if is_file else 'folder'}"] if problem else []


def _git_dir_around(path: Path) -> Path | None:
    """The git directory ``path`` lies in (itself or an ancestor), after resolving symlinks, or None."""
    for d in (path.resolve(), *path.resolve().parents):
        if d.name == ".git" or ((d / "HEAD").is_file() and (d / "objects").is_dir() and (d / "refs").is_dir()):
            return d
    return None


def _unwritable(path: Path, what: str, is_file: bool = False) -> str | None:
    """Why ``path`` (a folder, or with ``is_file`` a file) cannot be created or written, or None.
    Asked with access(2), which knows read-only mounts and immutable files even for root: nothing
    is opened or made."""
    path = path.expanduser().absolute()
    if path.exists():
        if is_file and not path.is_file():
            return f"{path} is not a file"
        if not is_file and not path.is_dir():
            return f"{path} is a file, not a folder"
        if is_file and _denied(path):
            return f"the {what} {path} is not writable ({_denied(path)})"
    folder = path.parent if is_file or not path.exists() else path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, so the {what} {path} cannot be made under it"
    if _denied(folder):
        return f"the folder {folder} is not writable ({_denied(folder)}), so the {what} {path} cannot be written"
    return None


def _denied(path: Path) -> str | None:
    if os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
        return None
    return "a read-only file system" if os.statvfs(path).f_flag & os.ST_RDONLY else "no write permission"


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
