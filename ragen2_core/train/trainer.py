"""The training loop: ``run(cfg, sink) -> result``, read top to bottom.

Each step: rollout -> diagnostics (MI proxy) -> filter (SNR hook) -> gradient probe -> learn
(advantage, loss, optimizer steps: learner.py) -> metrics (step_metrics.py) -> eval -> stops ->
checkpoint, one call per stage. The actor's objective (loss terms, coefficients, where KL goes) is
decided once, in `algo/objective.py`; what a stage reads is `state.RunContext`. Everything random is
derived from ``(train.seed, step)``, so a resumed run replays exactly the steps an uninterrupted one
would, given the model, optimizer and loop state in the checkpoint.

    from ragen2_core.config import load_config
    from ragen2_core.tracking import StdoutSink
    result = run(load_config("sweeps/base/frozenlake_tiny.yaml"), StdoutSink(total_steps=100))
    result["stop_reason"]     # "completed", or which early stop ended the run
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch

from ragen2_core.algo.filter import (group_reward_stats, loss_scale_factor, select_groups, soft_group_weights,
                                     zero_spread)
from ragen2_core.algo.schedules import filter_value
from ragen2_core.config import config_hash, dump_yaml
from ragen2_core.envs.registry import env_factory
from ragen2_core.metrics.collapse import collapse_metrics, ema_state
from ragen2_core.policy.load import load_policy, load_reference
from ragen2_core.rollout.cross_score import score_batch
from ragen2_core.rollout.dump import dump_rollouts
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.evaluate import evaluate, val_seeds
from ragen2_core.rollout.prompt import load_prompt_format
from ragen2_core.rollout.sampler import SamplingParams
from ragen2_core.schema import flatten
from ragen2_core.train import checkpoint
from ragen2_core.train.critic import build_critic
from ragen2_core.train.engine import TrainEngine, agree, init_distributed, reference_policy, total_over_ranks
from ragen2_core.train.grad_probe import probe_batch
from ragen2_core.train.learner import build_objective, prepare, update
from ragen2_core.train.scoring import logp_mismatch
from ragen2_core.train.state import (FILTER_STREAM, MI_PROBE_STREAM, ROLLOUT_STREAM, RunContext, Selection,
                                     step_rng)
from ragen2_core.train.step_metrics import cost_metrics, rollout_metrics, sample_text
from ragen2_core.train.stops import StopMonitor
from ragen2_core.tracking import git_sha, run_tags
from ragen2_core.batches import RolloutBatch


def run(cfg, sink) -> dict:
    # ================================================================ setup
    found = checkpoint.latest(Path(cfg.train.output_dir)) if cfg.train.resume else None
    if found is None:
        record_run(cfg, sink)  # before setup, so a run that fails there still says what it was
    ctx = setup(cfg, sink)
    start_step = resume_or_start(ctx, found)
    ctx.vllm = start_vllm(ctx)
    last_eval: dict = {}
    metrics: dict = {}
    stop_reason = "completed"
    step = start_step - 1
    for step in range(start_step, cfg.train.steps):
        t_step = time.perf_counter()
        # ============================================================ rollout
        batch, group_rewards, metrics = rollout_step(ctx, step)
        reason = None  # set by an early stop

        # ============================================================ diagnostics: MI proxy
        if due(cfg.collapse.every, step, first=True) and ctx.rank == 0:
            mi, reason = diagnose_collapse(ctx, step, batch)
            metrics |= mi

        # ============================================================ filter (SNR hook)
        t0 = time.perf_counter()
        sel, filter_metrics, kept_anywhere = filter_groups(ctx, step, batch, group_rewards)
        metrics |= filter_metrics
        reason = ctx.monitor.after_step(kept_groups=kept_anywhere,
                                        group_reward_std=metrics["rollout/group_reward_std"]) or reason
        metrics["filter/empty_streak"] = ctx.monitor.empty_streak

        # ============================================================ diagnostics: gradient probe
        if due(cfg.grad_probe.every, step, first=True):
            metrics |= probe_gradients(ctx, batch, group_rewards, sel)
            t0 += metrics["time/grad_probe_s"]  # keep the probe out of the update's cost

        # ============================================================ advantage / loss / step
        metrics |= learn(ctx, step, batch, sel, kept_anywhere)
        metrics["time/update_s"] = time.perf_counter() - t0

        # ============================================================ metrics: cost
        metrics |= cost_metrics(ctx, batch, sel.kept_rows, metrics)

        # ============================================================ eval
        if ctx.rank == 0 and (due(cfg.train.eval_every, step) or (cfg.train.eval_every and step + 1 == cfg.train.steps)):
            last_eval, eval_metrics = validate(ctx, step)
            metrics |= eval_metrics
            reason = reason or ctx.monitor.after_eval(success=last_eval["eval/success"])
        metrics["time/step_s"] = time.perf_counter() - t_step
        sink.log_metrics(metrics, step=step + 1)

        # ============================================================ stops
        # An early-stopped run is finished: no checkpoint is written for its last step, so a resume
        # does not train on past the point where it failed.
        reason = agree(reason, ctx.world)

        # ============================================================ checkpoint
        if due(cfg.train.checkpoint_every, step) and not reason:
            checkpoint.save(ctx.out_dir, step, ctx.actor, ctx.critic, keep=cfg.train.keep_checkpoints, rank=ctx.rank,
                            extra={"loop": ctx.loop, "stops": ctx.monitor.state_dict()})
        if reason:
            stop_reason = reason
            print(f"[train] early stop at step {step + 1}: {reason}", flush=True)
            break

    # ================================================================ export
    return export(ctx, step, stop_reason, metrics, last_eval)


def due(every: int, step: int, *, first: bool = False) -> bool:
    """Whether a stage that runs every `every` steps (0 = never) runs at 0-based `step`: after steps
    every, 2 every, ... (eval, checkpoints), or with ``first`` at steps 1, 1 + every, ... (diagnostics,
    which measure the starting policy first)."""
    return bool(every) and (step % every == 0 if first else (step + 1) % every == 0)


def setup(cfg, sink) -> RunContext:
    """Threads, seeds, process group, policy, reference, critic and engines."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed = cfg.train.seed
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    rank, world = init_distributed()  # under torchrun each rank rolls out its own groups
    out_dir = Path(cfg.train.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    algo, rcfg = cfg.algo, cfg.rollout
    objective = build_objective(cfg)

    model, tok, policy_path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    make_env = env_factory(cfg.env)
    reference = (reference_policy(model, load_reference(cfg.algo.kl_reference, cfg.policy, tok))
                 if objective.uses_reference else None)
    n_rows = rcfg.n_groups * rcfg.group_size
    micro = max(1, -(-n_rows // (algo.mini_batches * cfg.train.grad_accum)))
    engine_kw = dict(zero_stage=cfg.train.zero_stage, grad_accum=cfg.train.grad_accum,
                     micro_batch_size=micro, max_grad_norm=algo.max_grad_norm,
                     user_config=cfg.train.deepspeed_config,
                     bf16=cfg.policy.dtype == "bfloat16")  # fp32 master weights under a bf16 model
    actor = TrainEngine(model, lr=algo.actor_lr, **engine_kw)
    critic = (TrainEngine(build_critic(policy_path, model), lr=algo.critic_lr, **engine_kw)
              if algo.advantage == "gae" else None)
    sampling = SamplingParams(temperature=rcfg.temperature, top_p=rcfg.top_p, top_k=rcfg.top_k,
                              max_new_tokens=rcfg.max_new_tokens,
                              max_context_tokens=rcfg.max_context_tokens, compile=rcfg.compile)
    eval_sampling = sampling if not cfg.train.eval_greedy else SamplingParams(
        greedy=True, max_new_tokens=rcfg.max_new_tokens, max_context_tokens=rcfg.max_context_tokens,
        compile=rcfg.compile)
    whiten_adv = algo.whiten_advantages if algo.whiten_advantages is not None else algo.advantage == "gae"
    return RunContext(cfg=cfg, sink=sink, rank=rank, world=world, out_dir=out_dir, actor=actor, critic=critic,
                      reference=reference, tok=tok, make_env=make_env, env=make_env(), objective=objective,
                      whiten=whiten_adv, micro=micro, sampling=sampling, eval_sampling=eval_sampling,
                      monitor=StopMonitor(cfg.stops), policy_path=str(policy_path),
                      prompt_format=load_prompt_format(tok, cfg.policy.chat_template))


def resume_or_start(ctx: RunContext, found: Path | None) -> int:
    """The first step to run: after checkpoint `found` (the newest, on resume), else 0 (tagging the
    policy loaded)."""
    if found is None:
        ctx.sink.set_tags({"ragen2.policy": ctx.policy_path})
        return 0
    state = checkpoint.load(found, ctx.actor, ctx.critic)
    ctx.loop |= {k: v for k, v in state.get("loop", {}).items() if k in ctx.loop}
    ctx.monitor.load_state_dict(state.get("stops", {}))
    print(f"[train] resumed from {found} at step {state['step'] + 1}", flush=True)
    return state["step"] + 1


def record_run(cfg, sink) -> None:
    """The run's params, reproducibility tags and resolved config (a resumed run logged them when it began)."""
    sink.log_params(flatten(cfg))
    sink.set_tags(run_tags(config_hash(cfg), cfg.train.seed, git_sha(Path(__file__).parent)))
    sink.log_text(dump_yaml(cfg), "config.yaml")


def start_vllm(ctx: RunContext):
    """rollout.backend=vllm: a colocated engine, given the (possibly resumed) weights now and after each update."""
    if ctx.cfg.rollout.backend != "vllm":
        return None
    from ragen2_core.policy.lora import plain_weights
    from ragen2_core.rollout.vllm_backend import VLLMEngine
    return VLLMEngine(ctx.actor.module, dtype=ctx.cfg.policy.dtype, max_context_tokens=ctx.cfg.rollout.max_context_tokens,
                      memory_gb=ctx.cfg.rollout.vllm_memory_gb, seed=ctx.cfg.train.seed, weights=plain_weights)


def rollout_step(ctx: RunContext, step: int) -> tuple[RolloutBatch, torch.Tensor, dict]:
    """Sample the step's groups; returns the batch, its [G, S] float64 episode rewards and `rollout/*`."""
    rcfg, seed = ctx.cfg.rollout, ctx.cfg.train.seed
    rng = step_rng(seed, step, ROLLOUT_STREAM, ctx.rank)
    group_seeds = rng.integers(0, ctx.cfg.env.val_seed_start, rcfg.n_groups).tolist()
    env_seeds = [s for s in group_seeds for _ in range(rcfg.group_size)]
    dyn_seeds = rng.integers(0, 2**31 - 1, len(env_seeds)).tolist()
    group_ids = [g for g in range(rcfg.n_groups) for _ in range(rcfg.group_size)]
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
    t0 = time.perf_counter()
    batch = rollout(ctx.actor.module, ctx.tok, ctx.make_env, env_seeds=env_seeds, dynamics_seeds=dyn_seeds,
                    group_ids=group_ids, sampling=ctx.sampling, generator=gen, prompt_format=ctx.prompt_format,
                    session=ctx.vllm.session(len(env_seeds)) if ctx.vllm else None)
    rollout_s = time.perf_counter() - t0
    # float64: the spread statistics and the zero-spread test see the rewards as the env gave them.
    group_rewards = torch.tensor(batch.episode_reward, dtype=torch.float64).view(rcfg.n_groups, rcfg.group_size)
    rollout_tokens = sum(map(sum, batch.response_mask))
    metrics = rollout_metrics(batch, group_rewards, rollout_tokens, ctx.env)
    metrics |= {"time/rollout_s": rollout_s, "perf/tokens_per_s": rollout_tokens / max(rollout_s, 1e-9),
                "cost/rollout_tokens": rollout_tokens}
    if ctx.vllm:
        metrics |= logp_mismatch(ctx.actor.module, batch, pad_id=ctx.tok.pad_token_id, micro=ctx.micro)
    return batch, group_rewards, metrics


def diagnose_collapse(ctx: RunContext, step: int, batch: RolloutBatch) -> tuple[dict, str | None]:
    """`collapse/*` from cross-scoring the batch's first-turn reasonings, and the alert's stop reason."""
    cfg, ccfg, seed = ctx.cfg, ctx.cfg.collapse, ctx.cfg.train.seed
    t0 = time.perf_counter()
    scores, lengths, rows_used = score_batch(
        ctx.actor.module, batch, n_prompts=ccfg.n_prompts, k_samples=ccfg.k_samples,
        rng=step_rng(seed, step, MI_PROBE_STREAM, ctx.rank), trajectory=ccfg.trajectory, token_budget=ccfg.token_budget)
    mi = collapse_metrics(scores, lengths=lengths, n_perm=ccfg.n_perm, seed=seed * 100_003 + step,
                          ema=ctx.loop["collapse_ema"], ema_decay=ccfg.ema_decay)
    ctx.loop["collapse_ema"] = ema_state(mi)
    watched = mi[cfg.stops.mi_alert_metric]
    alert, stop = ctx.monitor.after_mi(zscore_ema=watched)
    if alert:
        print(f"[train] template-collapse alert at step {step + 1}: collapse/{cfg.stops.mi_alert_metric} "
              f"{watched:.2f} < {cfg.stops.mi_alert_zscore}", flush=True)
    if ccfg.dump_rollouts:
        dump_rollouts(batch.select(rows_used), ctx.tok, ctx.out_dir / "rollouts.jsonl", step=step + 1)
    out = {f"collapse/{k}": v for k, v in mi.items()} | {
        "collapse/alert": float(alert), "collapse/n_prompts": scores.shape[0], "collapse/k_samples": scores.shape[1],
        "time/collapse_s": time.perf_counter() - t0}
    return out, stop


def filter_groups(ctx: RunContext, step: int, batch: RolloutBatch, group_rewards: torch.Tensor) -> tuple[Selection, dict, int]:
    """The SNR filter at this step's scheduled value, `filter/*`, and the groups kept over all ranks."""
    fcfg, sched = ctx.cfg.filter, ctx.cfg.filter.schedule
    value = filter_value(step, total_steps=ctx.cfg.train.steps, kind=sched.kind, start=fcfg.value, end=sched.end,
                         warmup_steps=sched.warmup_steps)
    draw = None
    if fcfg.pick == "random":
        seed = step_rng(ctx.cfg.train.seed, step, FILTER_STREAM, ctx.rank).integers(2**62)
        draw = torch.Generator().manual_seed(int(seed))
    keep = select_groups(group_rewards, strategy=fcfg.strategy, value=value, mode=fcfg.mode,
                         statistic=fcfg.statistic, include_zero=fcfg.include_zero, pick=fcfg.pick, generator=draw)
    spread = group_reward_stats(group_rewards, statistic="std")
    kept_rows = [b for b, g in enumerate(batch.group_ids) if keep[g]]
    kept_ratio = float(keep.float().mean())
    row_weight = torch.ones(len(batch))
    if fcfg.soft_reweight:
        row_weight = soft_group_weights(group_rewards, statistic=fcfg.statistic).float()[torch.tensor(batch.group_ids)]
    sel = Selection(keep=keep, kept_rows=kept_rows, scale=loss_scale_factor(kept_ratio, mode=fcfg.loss_scale),
                    row_weight=row_weight)
    dropped = spread[~keep]  # what the filter removed: NaN on a step that kept every group
    kept_anywhere = total_over_ranks(int(keep.sum()), ctx.world)
    return sel, {"filter/kept_ratio": kept_ratio, "filter/kept_groups": int(keep.sum()),
                 "filter/zero_std_groups": int(zero_spread(group_rewards).sum()),
                 "filter/kept_group_reward_std": float(spread[keep].mean()) if keep.any() else 0.0,
                 "filter/dropped_group_reward_std": float(dropped.mean()) if len(dropped) else float("nan"),
                 "filter/dropped_group_reward_std_max": float(dropped.max()) if len(dropped) else float("nan"),
                 "filter/value": value}, kept_anywhere


def probe_gradients(ctx: RunContext, batch: RolloutBatch, group_rewards: torch.Tensor, sel: Selection) -> dict:
    """Task / KL / entropy gradient components on the whole batch at the current parameters."""
    t0 = time.perf_counter()
    prep = prepare(ctx, batch, sel.row_weight, on_policy=True)
    spread = group_reward_stats(group_rewards, statistic="std")
    out = probe_batch(ctx.actor.module, prep, batch.group_ids, spread, objective=ctx.objective,
                      buckets=ctx.cfg.grad_probe.buckets, micro=ctx.micro, scale=sel.scale)
    return out | {"time/grad_probe_s": time.perf_counter() - t0}


def learn(ctx: RunContext, step: int, batch: RolloutBatch, sel: Selection, kept_anywhere: int) -> dict:
    """The update on the kept rows (learner.py), then the vLLM engine's weights. An empty selection
    skips the update (the stop monitor counts the streak). Under data parallelism a rank whose filter
    kept nothing still joins the others' gradient all-reduce, with one group at zero weight, so no
    rank waits forever."""
    metrics: dict = {}
    if sel.kept_rows:
        metrics = update(ctx, batch.select(sel.kept_rows), sel.row_weight[sel.kept_rows], step, sel.scale)
    elif kept_anywhere:
        stand_in = [b for b, g in enumerate(batch.group_ids) if g == batch.group_ids[0]]
        update(ctx, batch.select(stand_in), sel.row_weight[stand_in], step, sel.scale, weight=0.0)
    if ctx.vllm and kept_anywhere:
        ctx.vllm.sync(ctx.actor.module)
    return metrics


def validate(ctx: RunContext, step: int) -> tuple[dict, dict]:
    """`eval/*` on the fixed validation seeds (rank 0); logs three sample episodes as text."""
    t0 = time.perf_counter()
    stats, eval_batch = evaluate(ctx.actor.module, ctx.tok, ctx.make_env, seeds=val_seeds(ctx.cfg.env),
                                 sampling=ctx.eval_sampling, seed=ctx.cfg.train.seed, prompt_format=ctx.prompt_format)
    last_eval = {f"eval/{k}": v for k, v in stats.items()}
    ctx.sink.log_text(sample_text(eval_batch, ctx.tok, k=3), f"samples/eval_step{step + 1:06d}.txt")
    return last_eval, last_eval | {"time/eval_s": time.perf_counter() - t0}


def export(ctx: RunContext, step: int, stop_reason: str, metrics: dict, last_eval: dict) -> dict:
    """Save the final policy, tag the stop reason, write result.json atomically."""
    export_dir = ctx.out_dir / "policy"
    checkpoint.export_policy(ctx.actor, ctx.tok, export_dir, rank=ctx.rank)
    ctx.sink.log_artifact(export_dir, "policy")
    ctx.sink.set_tags({"ragen2.stop_reason": stop_reason})
    result = {"steps": ctx.cfg.train.steps, "steps_done": step + 1, "stop_reason": stop_reason,
              "policy_dir": str(export_dir), **metrics, **last_eval}
    if ctx.rank == 0:
        checkpoint.write_json_atomic(ctx.out_dir / "result.json", result)
    return result


