"""The embedded default policy: tokenizer + tiny Qwen2, warm-started on exact-solver traces, cached.

Expert traces come from each env's BFS solver, re-planned every turn. Each episode's reasoning is
either *grounded* (names the positions and writes the remaining path as a scratchpad, which is what
makes the answer easy to produce) or a fixed *template* sentence, mixed by ``grounded_frac``. So the
warm-started policy's reasoning depends on its input (MI clearly above zero) and can collapse to
the template under RL.

The result is saved with ``save_pretrained`` under ``<cache_dir>/embedded-<key>/`` where ``key``
hashes everything that shapes it; building is atomic (temp dir + rename) and locked, so parallel
trials build it once. The policies of the shipped configs (the demo's and the reproduction study's)
are kept, built by this same code, in ``ragen2_core/policy/shipped/embedded-<key>/``: a policy is
looked up in the cache, then there, and built only when neither has its key.

    path = embedded_policy_path(policy_cfg, warmstart_cfg, env_cfg)   # builds on first call
    path = embedded_policy_path(..., rebuild=True)                     # from scratch, into the cache
    ship(path)                                                         # copy it among the shipped ones
    model = AutoModelForCausalLM.from_pretrained(path)
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ragen2_core.atomic import build_folder_once
from ragen2_core.config import RL_ONLY_ENV_FIELDS, trace_env
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.model import EMBEDDED_MARKER, build_tiny_qwen2, count_parameters, save_policy
from ragen2_core.policy.tokenizer import train_tokenizer
from ragen2_core.rollout.prompt import RAW, ChatFormat, RawFormat, read_template, template_markers, user_text

# Bump when env text, prompt format or trace style changes: cached policies would be stale.
FORMAT_VERSION = 3
TOKENIZER_EPISODES = 400      # expert episodes per env that the BPE is trained on
REPLY_BUDGET = 96             # the budget number the expert prompts show (rollout.max_new_tokens)
LATER_ENVS = ("math", "code", "doors")  # env sections outside the key unless listed in warmstart.envs
SHIPPED = Path(__file__).parent / "shipped"  # policies kept in the repository, so a clone needs no warm start


def reply_text(think: str, actions: list[str]) -> str:
    """The reply as the model should write it (generation starts after ``<think>``)."""
    return f"{think}</think><answer>{' || '.join(actions)}</answer>"


def expert_episode(env, seed: int, style: str, prompt_format: RawFormat = RAW) -> list[tuple[str, str]]:
    """[(prompt piece, reply), ...] of one solved-by-BFS episode (slip as the env has it), rendered
    in ``prompt_format`` (rollout/prompt.py)."""
    obs = env.reset(seed)
    conv = prompt_format.start(env.system_prompt(), user_text(1, obs, env.actions_left, REPLY_BUDGET))
    turns, chunk, turn = [], conv.text, 1
    while True:
        expert = env.expert_turn(style)
        reply = reply_text(expert.think, expert.actions)
        turns.append((chunk, reply))
        conv.reply(reply)
        if turn >= env.max_turns:  # the last turn's step would only cost time (a sandbox run for code)
            return turns
        result = env.step("<think>" + reply)
        if result.done:
            return turns
        turn += 1
        chunk = conv.follow(user_text(turn, result.observation, env.actions_left, REPLY_BUDGET,
                                      reward=result.reward))


def cache_key(policy_cfg, warm_cfg, env_cfg) -> str:
    # Sections of envs added after the grid envs enter the key only when their traces are used, so
    # adding an env to the config does not invalidate the policies already cached.
    unused = [name for name in LATER_ENVS if name not in warm_cfg.envs]
    # The key follows the env the traces are played in (warmstart.env over the run's), so a run on
    # harder maps than its warm start's still finds that policy.
    shape = {"version": FORMAT_VERSION, "policy": asdict(policy_cfg), "warmstart": asdict(warm_cfg),
             "env": {k: v for k, v in asdict(trace_env(env_cfg, warm_cfg.env)).items()
                     if k not in (*RL_ONLY_ENV_FIELDS, *unused)}}
    shape["warmstart"].pop("env")
    shape["warmstart"].pop("pretrained")  # a pretrained model's switch: never shapes the embedded one
    shape["policy"].pop("cache_dir")
    shape["policy"].pop("model")
    # Adapters are injected when training starts (policy/load.py); the warm start never sees them.
    shape["policy"].pop("lora")
    # The embedded tokenizer has no template of its own, so auto and none both give the raw text the
    # policies cached before this field were trained on; a template enters the key by its content.
    template = read_template(shape["policy"].pop("chat_template", "auto"))
    if template is not None:
        shape["policy"]["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest()
    # Fields added with a default that reproduces the old traces stay out of the key at that default,
    # so the policies cached before them stay valid.
    if shape["env"]["frozenlake"].get("scratchpad") == "path":
        del shape["env"]["frozenlake"]["scratchpad"]
    if shape["warmstart"]["grounded_steps"] == 0:
        del shape["warmstart"]["grounded_steps"]
    # A policy continued from the default one depends on that policy: its key stands in for it.
    if shape["warmstart"].pop("init_from") == "default":
        shape["warmstart"]["init_from"] = default_key()
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]


def default_configs(cache_dir: str):
    """(policy, warmstart, env) sections of the default embedded policy, cached under ``cache_dir``."""
    from ragen2_core.config import load_config
    cfg = load_config(None, [f"policy.cache_dir={cache_dir}"])
    return cfg.policy, cfg.warmstart, cfg.env


def default_key() -> str:
    return cache_key(*default_configs("~/.cache/ragen2"))


def grounded_stage(warm_cfg):
    """The first stage of a curriculum warm start: the same recipe on grounded traces only. A lookup
    the reasoning needs appears late and as a jump (docs/reproduction.md); in a mixed warm start it sees
    half the traces and had not appeared by the end, so the steps are learned first, the choice after."""
    return replace(warm_cfg, grounded_frac=1.0, steps=warm_cfg.grounded_steps, grounded_steps=0)


def expert_traces(warm_cfg, env_cfg, n_per_env: int, seed_base: int, prompt_format: RawFormat = RAW
            ) -> list[list[tuple[str, str]]]:
    rng = random.Random(warm_cfg.seed + seed_base)
    episodes = []
    for name in warm_cfg.envs:
        env = env_factory(trace_env(env_cfg, warm_cfg.env), name)()
        for i in range(n_per_env):
            style = "grounded" if rng.random() < warm_cfg.grounded_frac else "template"
            episodes.append(expert_episode(env, seed_base + i, style, prompt_format))
    rng.shuffle(episodes)
    return episodes


def tokenize_traces(episodes, tok, eot: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) per episode, each piece encoded on its own as the rollout encodes it. With a
    chat template's end-of-turn token ``eot``, each reply is trained to end with it and the next piece
    starts after it, exactly the ids of a rollout in which the policy closed its own turns."""
    out = []
    for ep in episodes:
        ids, mask = [], []
        for chunk, reply in ep:
            c, r = tok.encode(chunk, add_special_tokens=False), tok.encode(reply, add_special_tokens=False)
            if eot is not None:
                c = c[1:] if ids and c[:1] == [eot] else c
                r = r + [eot]
            ids += c + r
            mask += [0] * len(c) + [1] * len(r)
        out.append((ids, mask))
    return out


def supervised_pass(model, data, *, steps: int, batch_size: int, lr: float, seed: int,
                    pad_id: int, log_every: int = 50) -> list[float]:
    """Cross-entropy on reply tokens only; AdamW with cosine decay. Returns the loss curve."""
    gen = torch.Generator().manual_seed(seed)
    # Batches are drawn from a window of similar lengths: padding would otherwise cost ~40 %.
    by_len = sorted(range(len(data)), key=lambda i: len(data[i][0]))
    window = min(len(data), 4 * batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    losses, t0 = [], time.time()
    for step in range(steps):
        start = int(torch.randint(len(data) - window + 1, (1,), generator=gen))
        pick = torch.randint(window, (batch_size,), generator=gen).tolist()
        idx = [by_len[start + j] for j in pick]
        T = max(len(data[i][0]) for i in idx)
        ids = torch.full((batch_size, T), pad_id, dtype=torch.long)
        labels = torch.full((batch_size, T), -100, dtype=torch.long)
        attn = torch.zeros(batch_size, T, dtype=torch.long)
        for b, i in enumerate(idx):
            seq, mask = data[i]
            ids[b, :len(seq)] = torch.tensor(seq)
            attn[b, :len(seq)] = 1
            labels[b, :len(seq)] = torch.where(torch.tensor(mask, dtype=torch.bool),
                                               torch.tensor(seq), torch.tensor(-100))
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"[warmstart] step {step + 1}/{steps} loss {loss.item():.4f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    return losses


def build_embedded(out_dir: Path, policy_cfg, warm_cfg, env_cfg, base_dir: Path | None = None) -> dict:
    """Train the tokenizer, init the model, run the supervised pass, save everything to out_dir. With
    ``base_dir`` (warmstart.init_from=default, or a curriculum's grounded stage) the tokenizer and the
    starting weights are that policy's."""
    if base_dir is not None:
        return _continue_embedded(out_dir, warm_cfg, env_cfg, base_dir)
    t0 = time.time()
    template = read_template(policy_cfg.chat_template)
    prompt_format, specials = RAW, template_markers(template) if template else []
    if template:
        # Rendering needs a tokenizer; a draft trained on the raw traces renders the corpus that the
        # real one is trained on, so the template's own words become tokens too.
        draft = train_tokenizer([c + r for ep in expert_traces(warm_cfg, env_cfg, 50, seed_base=0) for c, r in ep],
                                vocab_size=policy_cfg.vocab_size, specials=specials)
        prompt_format = ChatFormat(draft, template)
    corpus_eps = expert_traces(warm_cfg, env_cfg, TOKENIZER_EPISODES, seed_base=0, prompt_format=prompt_format)
    # The corpus also sees the grounded style for every env, whatever grounded_frac is.
    texts = [c + r for ep in corpus_eps for c, r in ep]
    for name in warm_cfg.envs:
        env = env_factory(trace_env(env_cfg, warm_cfg.env), name)()
        env.reset(0)
        texts.append(env.expert_turn("grounded").think + env.expert_turn("template").think)
        texts.append(env.step("no tags").observation)
    tok = train_tokenizer(texts, vocab_size=policy_cfg.vocab_size, specials=specials)
    if template:
        tok.chat_template = template  # saved with the policy: `auto` finds it there
        prompt_format = ChatFormat(tok, template)
    model = build_tiny_qwen2(tok, hidden_size=policy_cfg.hidden_size, num_layers=policy_cfg.num_layers,
                             num_heads=policy_cfg.num_heads, num_kv_heads=policy_cfg.num_kv_heads,
                             intermediate_size=policy_cfg.intermediate_size, seed=warm_cfg.seed)
    meta = {"params": count_parameters(model), "vocab": len(tok), "warmstart": asdict(warm_cfg)}
    if warm_cfg.enabled:
        # Training episodes use seeds disjoint from the tokenizer corpus and from validation.
        episodes = expert_traces(warm_cfg, env_cfg, warm_cfg.episodes, seed_base=10_000_000, prompt_format=prompt_format)
        data = tokenize_traces(episodes, tok)
        losses = supervised_pass(model, data, steps=warm_cfg.steps, batch_size=warm_cfg.batch_size,
                                 lr=warm_cfg.lr, seed=warm_cfg.seed, pad_id=tok.pad_token_id)
        meta |= {"final_loss": sum(losses[-20:]) / len(losses[-20:]),
                 "mean_tokens": sum(len(d[0]) for d in data) / len(data)}
    meta["build_seconds"] = round(time.time() - t0, 1)
    save_policy(model, tok, out_dir, meta)
    return meta


def _continue_embedded(out_dir: Path, warm_cfg, env_cfg, base_dir: Path) -> dict:
    # A lookup task learned from scratch stays at chance for millions of tokens (REFERENCE.md 9): the
    # default policy already copies the value after a key, so a new setting starts from it (or from
    # its curriculum's grounded stage, which started from it).
    from ragen2_core.policy.model import load_pretrained
    t0 = time.time()
    model, tok = load_pretrained(str(base_dir))
    episodes = expert_traces(warm_cfg, env_cfg, warm_cfg.episodes, seed_base=10_000_000)
    data = tokenize_traces(episodes, tok)
    losses = supervised_pass(model, data, steps=warm_cfg.steps, batch_size=warm_cfg.batch_size,
                             lr=warm_cfg.lr, seed=warm_cfg.seed, pad_id=tok.pad_token_id)
    meta = {"params": count_parameters(model), "vocab": len(tok), "warmstart": asdict(warm_cfg),
            "init_from": base_dir.name, "final_loss": sum(losses[-20:]) / len(losses[-20:]),
            "mean_tokens": sum(len(d[0]) for d in data) / len(data), "build_seconds": round(time.time() - t0, 1)}
    save_policy(model, tok, out_dir, meta)
    return meta


def find_policy(policy_cfg, warm_cfg, env_cfg) -> tuple[Path, str]:
    """(where the policy with this key is or would be built, "cached" | "shipped" | "missing")."""
    name = f"embedded-{cache_key(policy_cfg, warm_cfg, env_cfg)}"
    cached = Path(os.path.expanduser(policy_cfg.cache_dir)) / name
    if (cached / EMBEDDED_MARKER).exists():
        return cached, "cached"
    if (SHIPPED / name / EMBEDDED_MARKER).exists():
        return SHIPPED / name, "shipped"
    return cached, "missing"


def embedded_policy_path(policy_cfg, warm_cfg, env_cfg, rebuild: bool = False) -> Path:
    """Path of the embedded policy: the cached or shipped one, else built (once, under a file lock)
    into the cache. ``rebuild`` builds it from scratch into the cache whatever exists; the cached
    copy then takes precedence over a shipped one."""
    found, where = find_policy(policy_cfg, warm_cfg, env_cfg)
    if where != "missing" and not rebuild:
        return found
    # The policy continued from is found (or built) first: this build's traces start from it.
    base = None
    if warm_cfg.grounded_steps:
        base = embedded_policy_path(policy_cfg, grounded_stage(warm_cfg), env_cfg)
    elif warm_cfg.init_from == "default":
        base = embedded_policy_path(*default_configs(policy_cfg.cache_dir))
    final = Path(os.path.expanduser(policy_cfg.cache_dir)) / f"embedded-{cache_key(policy_cfg, warm_cfg, env_cfg)}"

    def build(tmp: Path) -> None:
        print(f"[warmstart] building embedded policy -> {final}", flush=True)
        build_embedded(tmp, policy_cfg, warm_cfg, env_cfg, base_dir=base)

    return build_folder_once(final, EMBEDDED_MARKER, build, rebuild=rebuild)


def ship(path: Path) -> Path:
    """Copy a built policy into the shipped folder (for the repository; atomic: temp + rename)."""
    final = SHIPPED / path.name
    if path.resolve() == final.resolve():
        return final
    SHIPPED.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=SHIPPED))
    try:
        for f in sorted(path.iterdir()):
            shutil.copyfile(f, tmp / f.name)
        if final.is_symlink():
            final.unlink()
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
