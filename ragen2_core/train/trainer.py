"""The training loop: ``run(cfg, sink) -> result``, read top to bottom.

Each step: rollout -> diagnostics (MI proxy) -> filter (SNR hook) -> gradient probe -> learn
(advantage, loss, optimizer steps: learner.py) -> metrics (step_metrics.py) -> eval -> stops ->
checkpoint, one call per stage. The actor's objective (loss terms, coefficients, where KL goes) is
decided once, in `algo/objective.py`; what a stage reads is `state.Run`. Everything random is
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
from ragen2_core.rollout.prompt import prompt_format
from ragen2_core.rollout.sampler import SamplingParams
from ragen2_core.schema import flatten
from ragen2_core.train import checkpoint
from ragen2_core.train.critic import build_critic
from ragen2_core.train.engine import TrainEngine, agree, init_distributed, reference_policy, total_over_ranks
from ragen2_core.train.grad_probe import probe_batch
from ragen2_core.train.learner import build_objective, prepare, update
from ragen2_core.train.scoring import logp_mismatch
from ragen2_core.train.state import Run, Selection, step_rng
from ragen2_core.train.step_metrics import cost_metrics, rollout_metrics, sample_text
from ragen2_core.train.stops import StopMonitor
from ragen2_core.tracking import git_sha, run_tags
from ragen2_core.types import RolloutBatch


def run(cfg, sink) -> dict:
    # ================================================================ setup
    r = setup(cfg, sink)
    start_step = resume_or_start(r)
    r.vllm = start_vllm(r)
    last_eval: dict = {}
    metrics: dict = {}
    stop_reason = "completed"
    step = start_step - 1
    for step in range(start_step, cfg.train.steps):
        t_step = time.perf_counter()
        # ============================================================ rollout
        batch, group_rewards, metrics = rollout_step(r, step)
        reason = None  # set by an early stop

        # ============================================================ diagnostics: MI proxy
        if due(cfg.collapse.every, step, first=True) and r.rank == 0:
            mi, reason = diagnose_collapse(r, step, batch)
            metrics |= mi

        # ============================================================ filter (SNR hook)
        t0 = time.perf_counter()
        sel, filter_metrics, kept_anywhere = filter_groups(r, step, batch, group_rewards)
        metrics |= filter_metrics
        reason = r.monitor.after_step(kept_groups=kept_anywhere,
                                      group_reward_std=metrics["rollout/group_reward_std"]) or reason
        metrics["filter/empty_streak"] = r.monitor.empty_streak

        # ============================================================ diagnostics: gradient probe
        if due(cfg.grad_probe.every, step, first=True):
            metrics |= probe_gradients(r, batch, group_rewards, sel)
            t0 += metrics["time/grad_probe_s"]  # keep the probe out of the update's cost

        # ============================================================ advantage / loss / step
        metrics |= learn(r, step, batch, sel, kept_anywhere)
        metrics["time/update_s"] = time.perf_counter() - t0

        # ============================================================ metrics: cost
        metrics |= cost_metrics(r, batch, sel.kept_rows, metrics)

        # ============================================================ eval
        if r.rank == 0 and (due(cfg.train.eval_every, step) or (cfg.train.eval_every and step + 1 == cfg.train.steps)):
            last_eval, eval_metrics = validate(r, step)
            metrics |= eval_metrics
            reason = reason or r.monitor.after_eval(success=last_eval["eval/success"])
        metrics["time/step_s"] = time.perf_counter() - t_step
        sink.log_metrics(metrics, step=step + 1)

        # ============================================================ stops
        # An early-stopped run is finished: no checkpoint is written for its last step, so a resume
        # does not train on past the point where it failed.
        reason = agree(reason, r.world)

        # ============================================================ checkpoint
        if due(cfg.train.checkpoint_every, step) and not reason:
            checkpoint.save(r.out_dir, step, r.actor, r.critic, keep=cfg.train.keep_checkpoints, rank=r.rank,
                            extra={"loop": r.loop, "stops": r.monitor.state_dict()})
        if reason:
            stop_reason = reason
            print(f"[train] early stop at step {step + 1}: {reason}", flush=True)
            break

    # ================================================================ export
    return export(r, step, stop_reason, metrics, last_eval)


def due(every: int, step: int, *, first: bool = False) -> bool:
    """Whether a stage that runs every `every` steps (0 = never) runs at 0-based `step`: after steps
    every, 2 every, ... (eval, checkpoints), or with ``first`` at steps 1, 1 + every, ... (diagnostics,
    which measure the starting policy first)."""
    return bool(every) and (step % every == 0 if first else (step + 1) % every == 0)


def setup(cfg, sink) -> Run:
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
    r = Run(cfg=cfg, sink=sink, rank=rank, world=world, out_dir=out_dir, actor=actor, critic=critic,
            reference=reference, tok=tok, make_env=make_env, env=make_env(),
            objective=objective, whiten=whiten_adv, micro=micro, sampling=sampling, eval_sampling=eval_sampling,
            monitor=StopMonitor(cfg.stops), policy_path=str(policy_path),
            fmt=prompt_format(tok, cfg.policy.chat_template))
    return r


def resume_or_start(r: Run) -> int:
    """The first step to run: after the newest checkpoint on resume, else 0 (logging params and tags)."""
    cfg = r.cfg
    start_step = 0
    if cfg.train.resume:
        found = checkpoint.latest(r.out_dir)
        if found is not None:
            state = checkpoint.load(found, r.actor, r.critic)
            start_step = state["step"] + 1
            r.loop |= {k: v for k, v in state.get("loop", {}).items() if k in r.loop}
            r.monitor.load_state_dict(state.get("stops", {}))
            print(f"[train] resumed from {found} at step {start_step}", flush=True)
    if start_step == 0:
        r.sink.log_params(flatten(cfg))
        r.sink.set_tags(run_tags(config_hash(cfg), cfg.train.seed, git_sha(Path(__file__).parent)) | {"ragen2.policy": r.policy_path})
        r.sink.log_text(dump_yaml(cfg), "config.yaml")
    return start_step


def start_vllm(r: Run):
    """rollout.backend=vllm: a colocated engine, given the (possibly resumed) weights now and after each update."""
    if r.cfg.rollout.backend != "vllm":
        return None
    from ragen2_core.rollout.vllm_backend import VLLMEngine
    return VLLMEngine(r.actor.module, dtype=r.cfg.policy.dtype, max_context_tokens=r.cfg.rollout.max_context_tokens,
                      memory_gb=r.cfg.rollout.vllm_memory_gb, seed=r.cfg.train.seed)


def rollout_step(r: Run, step: int) -> tuple[RolloutBatch, torch.Tensor, dict]:
    """Sample the step's groups; returns the batch, its [G, S] float64 episode rewards and `rollout/*`."""
    rcfg, seed = r.cfg.rollout, r.cfg.train.seed
    rng = step_rng(seed, step, 0, r.rank)
    group_seeds = rng.integers(0, r.cfg.env.val_seed_start, rcfg.n_groups).tolist()
    env_seeds = [s for s in group_seeds for _ in range(rcfg.group_size)]
    dyn_seeds = rng.integers(0, 2**31 - 1, len(env_seeds)).tolist()
    group_ids = [g for g in range(rcfg.n_groups) for _ in range(rcfg.group_size)]
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
    t0 = time.perf_counter()
    batch = rollout(r.actor.module, r.tok, r.make_env, env_seeds=env_seeds, dynamics_seeds=dyn_seeds,
                    group_ids=group_ids, sampling=r.sampling, generator=gen, fmt=r.fmt,
                    session=r.vllm.session(len(env_seeds)) if r.vllm else None)
    rollout_s = time.perf_counter() - t0
    # float64: the spread statistics and the zero-spread test see the rewards as the env gave them.
    group_rewards = torch.tensor(batch.episode_reward, dtype=torch.float64).view(rcfg.n_groups, rcfg.group_size)
    rollout_tokens = sum(map(sum, batch.response_mask))
    metrics = rollout_metrics(batch, group_rewards, rollout_tokens, r.env)
    metrics |= {"time/rollout_s": rollout_s, "perf/tokens_per_s": rollout_tokens / max(rollout_s, 1e-9),
                "cost/rollout_tokens": rollout_tokens}
    if r.vllm:
        metrics |= logp_mismatch(r.actor.module, batch, pad_id=r.tok.pad_token_id, micro=r.micro)
    return batch, group_rewards, metrics


def diagnose_collapse(r: Run, step: int, batch: RolloutBatch) -> tuple[dict, str | None]:
    """`collapse/*` from cross-scoring the batch's first-turn reasonings, and the alert's stop reason."""
    cfg, ccfg, seed = r.cfg, r.cfg.collapse, r.cfg.train.seed
    t0 = time.perf_counter()
    scores, lengths, rows_used = score_batch(
        r.actor.module, batch, n_prompts=ccfg.n_prompts, k_samples=ccfg.k_samples,
        rng=step_rng(seed, step, 2, r.rank), trajectory=ccfg.trajectory, token_budget=ccfg.token_budget)
    mi = collapse_metrics(scores, lengths=lengths, n_perm=ccfg.n_perm, seed=seed * 100_003 + step,
                          ema=r.loop["collapse_ema"], ema_decay=ccfg.ema_decay)
    r.loop["collapse_ema"] = ema_state(mi)
    watched = mi[cfg.stops.mi_alert_metric]
    alert, stop = r.monitor.after_mi(zscore_ema=watched)
    if alert:
        print(f"[train] template-collapse alert at step {step + 1}: collapse/{cfg.stops.mi_alert_metric} "
              f"{watched:.2f} < {cfg.stops.mi_alert_zscore}", flush=True)
    if ccfg.dump_rollouts:
        dump_rollouts(batch.select(rows_used), r.tok, r.out_dir / "rollouts.jsonl", step=step + 1)
    out = {f"collapse/{k}": v for k, v in mi.items()} | {
        "collapse/alert": float(alert), "collapse/n_prompts": scores.shape[0], "collapse/k_samples": scores.shape[1],
        "time/collapse_s": time.perf_counter() - t0}
    return out, stop


def filter_groups(r: Run, step: int, batch: RolloutBatch, group_rewards: torch.Tensor) -> tuple[Selection, dict, int]:
    """The SNR filter at this step's scheduled value, `filter/*`, and the groups kept over all ranks."""
    fcfg, sched = r.cfg.filter, r.cfg.filter.schedule
    value = filter_value(step, total_steps=r.cfg.train.steps, kind=sched.kind, start=fcfg.value, end=sched.end,
                         warmup_steps=sched.warmup_steps)
    keep = select_groups(group_rewards, strategy=fcfg.strategy, value=value, mode=fcfg.mode,
                         statistic=fcfg.statistic, include_zero=fcfg.include_zero)
    spread = group_reward_stats(group_rewards, statistic="std")
    kept_rows = [b for b, g in enumerate(batch.group_ids) if keep[g]]
    kept_ratio = float(keep.float().mean())
    row_weight = torch.ones(len(batch))
    if fcfg.soft_reweight:
        row_weight = soft_group_weights(group_rewards, statistic=fcfg.statistic).float()[torch.tensor(batch.group_ids)]
    sel = Selection(keep=keep, kept_rows=kept_rows, scale=loss_scale_factor(kept_ratio, mode=fcfg.loss_scale),
                    row_weight=row_weight)
    dropped = spread[~keep]  # what the filter removed: NaN on a step that kept every group
    kept_anywhere = total_over_ranks(int(keep.sum()), r.world)
    return sel, {"filter/kept_ratio": kept_ratio, "filter/kept_groups": int(keep.sum()),
                 "filter/zero_std_groups": int(zero_spread(group_rewards).sum()),
                 "filter/kept_group_reward_std": float(spread[keep].mean()) if keep.any() else 0.0,
                 "filter/dropped_group_reward_std": float(dropped.mean()) if len(dropped) else float("nan"),
                 "filter/dropped_group_reward_std_max": float(dropped.max()) if len(dropped) else float("nan"),
                 "filter/value": value}, kept_anywhere


def probe_gradients(r: Run, batch: RolloutBatch, group_rewards: torch.Tensor, sel: Selection) -> dict:
    """Task / KL / entropy gradient components on the whole batch at the current parameters."""
    t0 = time.perf_counter()
    prep = prepare(r, batch, sel.row_weight, on_policy=True)
    spread = group_reward_stats(group_rewards, statistic="std")
    out = probe_batch(r.actor.module, prep, batch.group_ids, spread, objective=r.objective,
                      buckets=r.cfg.grad_probe.buckets, micro=r.micro, scale=sel.scale)
    return out | {"time/grad_probe_s": time.perf_counter() - t0}


def learn(r: Run, step: int, batch: RolloutBatch, sel: Selection, kept_anywhere: int) -> dict:
    """The update on the kept rows (learner.py), then the vLLM engine's weights. An empty selection
    skips the update (the stop monitor counts the streak). Under data parallelism a rank whose filter
    kept nothing still joins the others' gradient all-reduce, with one group at zero weight, so no
    rank waits forever."""
    metrics: dict = {}
    if sel.kept_rows:
        metrics = update(r, batch.select(sel.kept_rows), sel.row_weight[sel.kept_rows], step, sel.scale)
    elif kept_anywhere:
        stand_in = [b for b, g in enumerate(batch.group_ids) if g == batch.group_ids[0]]
        update(r, batch.select(stand_in), sel.row_weight[stand_in], step, sel.scale, weight=0.0)
    if r.vllm and kept_anywhere:
        r.vllm.sync(r.actor.module)
    return metrics


def validate(r: Run, step: int) -> tuple[dict, dict]:
    """`eval/*` on the fixed validation seeds (rank 0); logs three sample episodes as text."""
    t0 = time.perf_counter()
    stats, eval_batch = evaluate(r.actor.module, r.tok, r.make_env, seeds=val_seeds(r.cfg.env),
                                 sampling=r.eval_sampling, seed=r.cfg.train.seed, fmt=r.fmt)
    last_eval = {f"eval/{k}": v for k, v in stats.items()}
    r.sink.log_text(sample_text(eval_batch, r.tok, k=3), f"samples/eval_step{step + 1:06d}.txt")
    return last_eval, last_eval | {"time/eval_s": time.perf_counter() - t0}


def export(r: Run, step: int, stop_reason: str, metrics: dict, last_eval: dict) -> dict:
    """Save the final policy, tag the stop reason, write result.json atomically."""
    export_dir = r.out_dir / "policy"
    checkpoint.export_policy(r.actor, r.tok, export_dir, rank=r.rank)
    r.sink.log_artifact(export_dir, "policy")
    r.sink.set_tags({"ragen2.stop_reason": stop_reason})
    result = {"steps": r.cfg.train.steps, "steps_done": step + 1, "stop_reason": stop_reason,
              "policy_dir": str(export_dir), **metrics, **last_eval}
    if r.rank == 0:
        checkpoint.write_json_atomic(r.out_dir / "result.json", result)
    return result


