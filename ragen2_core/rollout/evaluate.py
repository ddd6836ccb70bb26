"""Validation on the fixed seed set, and the random-action baseline it is compared with.

    stats = evaluate(model, tok, make_env, seeds=val_seeds(cfg.env), sampling=SamplingParams(greedy=True))
    print(stats["success"], random_baseline(make_env, seeds)["success"])
"""
from __future__ import annotations

import random
from collections.abc import Callable

import torch

from ragen2_core.envs.base import TextEnv
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import SamplingParams
from ragen2_core.rollout.prompt import RAW, RawFormat
from ragen2_core.batches import RolloutBatch


def val_seeds(env_cfg) -> list[int]:
    """The fixed validation set; training seeds are drawn below ``val_seed_start``."""
    return list(range(env_cfg.val_seed_start, env_cfg.val_seed_start + env_cfg.val_seeds))


def think_text(response: str) -> str:
    """The reasoning of one reply text (``<think>...</think>...``), stripped."""
    return response.removeprefix("<think>").split("</think>", 1)[0].strip()


def shared_think_frac(thinks: list[str], prompts: list[int]) -> float:
    """Share of reasonings written word for word for at least two different prompts: text that
    cannot depend on its input. The template share of a model whose template nobody knows (a real
    LM's "To solve this puzzle, we need to..."); on the embedded envs it also counts the template."""
    seen: dict[str, set[int]] = {}
    for t, p in zip(thinks, prompts):
        seen.setdefault(t, set()).add(p)
    return sum(len(seen[t]) > 1 for t in thinks) / max(len(thinks), 1)


def batch_stats(batch: RolloutBatch, template: str | None = None) -> dict[str, float]:
    """Mean stats of a batch. With the env's ``template`` reasoning sentence it adds the share of turns
    that reason with exactly that sentence, and success split by the first turn's style: a direct,
    ground-truth view of template collapse that the MI proxy estimates without knowing the template."""
    n = len(batch)
    turns = sum(batch.n_turns)
    think = [e - s for spans in batch.think_spans for s, e in spans]
    stats = {
        "success": sum(batch.success) / n,
        "reward_mean": sum(batch.episode_reward) / n,
        "format_valid": sum(batch.n_valid_turns) / max(turns, 1),
        "turns": turns / n,
        "think_tokens": sum(think) / max(len(think), 1),
        "shared_think_frac": shared_think_frac([think_text(rs[0]) for rs in batch.responses if rs],
                                               [s for rs, s in zip(batch.responses, batch.env_seeds) if rs]),
    }
    if template is not None:
        is_tpl = [[think_text(r) == template for r in rs] for rs in batch.responses]
        first = [(t[0], ok) for t, ok in zip(is_tpl, batch.success) if t]
        stats["template_frac"] = sum(map(sum, is_tpl)) / max(sum(map(len, is_tpl)), 1)
        for style, want in (("template", True), ("grounded", False)):
            wins = [ok for t, ok in first if t == want]
            stats[f"success_{style}"] = sum(wins) / len(wins) if wins else float("nan")
    return stats


def evaluate(model, tokenizer, make_env: Callable[[], TextEnv], *, seeds: list[int],
             sampling: SamplingParams, seed: int = 0, chunk: int = 128, prompt_format: RawFormat = RAW
             ) -> tuple[dict, RolloutBatch]:
    """Play every seed once (dynamics seeded by the env seed, so the set is fixed); mean stats."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for i in range(0, len(seeds), chunk):
        s = seeds[i:i + chunk]
        parts.append(rollout(model, tokenizer, make_env, env_seeds=s, dynamics_seeds=s,
                             group_ids=list(range(i, i + len(s))), sampling=sampling, generator=gen,
                             prompt_format=prompt_format))
    batch = RolloutBatch(**{k: [x for p in parts for x in getattr(p, k)] for k in parts[0].__dict__})
    return batch_stats(batch, make_env().template_think), batch


def random_baseline(make_env: Callable[[], TextEnv], *, seeds: list[int], seed: int = 0) -> dict:
    """Success of uniformly random well-formed actions (max per turn), the floor to beat; None for
    envs without a discrete action set (math answers, programs), where it is not defined."""
    if not make_env().action_names:
        return {"success": None}
    rng = random.Random(seed)
    wins = 0
    for s in seeds:
        env = make_env()
        env.reset(s, dynamics_seed=s)
        while True:
            k = min(env.max_actions_per_turn, env.actions_left)
            acts = " || ".join(rng.choice(env.action_names) for _ in range(k))
            result = env.step(f"<think>random</think><answer>{acts}</answer>")
            if result.done:
                wins += int(result.success)
                break
    return {"success": wins / len(seeds)}
