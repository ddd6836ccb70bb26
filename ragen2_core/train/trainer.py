"""The training loop: ``run(cfg, sink) -> result``. One file, read top to bottom.

Each step: rollout -> diagnostics (MI proxy) -> filter (SNR hook) -> gradient probe -> advantage ->
loss/step -> metrics -> eval -> stops -> checkpoint, one call per stage. The actor's objective (loss
terms, coefficients, where KL goes) is decided once, in `algo/objective.py`. Everything random is
derived from ``(train.seed, step)``, so a resumed run replays exactly the steps an uninterrupted one
would, given the model, optimizer and loop state in the checkpoint.

    from ragen2_core.config import load_config
    from ragen2_core.tracking import StdoutSink
    result = run(load_config("sweeps/base/frozenlake_tiny.yaml"), StdoutSink(total_steps=100))
    result["stop_reason"]     # "completed", or which early stop ended the run
"""
from __future__ import annotations

import functools
import operator
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ragen2_core.algo.advantages import broadcast_to_tokens, gae_advantages, group_advantages, whiten
from ragen2_core.algo.filter import (group_reward_stats, loss_scale_factor, select_groups, soft_group_weights,
                                     zero_spread)
from ragen2_core.algo.losses import aggregate, kl_penalty, logp_entropy, value_loss
from ragen2_core.algo.objective import Objective, actor_terms, rewards_with_kl
from ragen2_core.algo.schedules import filter_value
from ragen2_core.config import SINGLE_TURN_ENVS, config_hash, dump_yaml
from ragen2_core.envs.code import sandbox_metrics
from ragen2_core.envs.registry import env_factory
from ragen2_core.metrics.collapse import collapse_metrics, ema_state
from ragen2_core.policy.load import load_policy, load_reference
from ragen2_core.rollout.cross_score import score_batch
from ragen2_core.rollout.dump import dump_rollouts
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import SamplingParams
from ragen2_core.rollout.evaluate import batch_stats, evaluate, val_seeds
from ragen2_core.rollout.prompt import prompt_format
from ragen2_core.schema import flatten
from ragen2_core.train import checkpoint
from ragen2_core.train.critic import build_critic
from ragen2_core.train.engine import TrainEngine, init_distributed, reference_policy
from ragen2_core.train.grad_probe import probe_batch
from ragen2_core.train.scoring import logp_mismatch, score_tokens, score_values
from ragen2_core.train.shared_prefix import RowPlan, forward_window, micro_batch_order, upload, window
from ragen2_core.train.stops import StopMonitor
from ragen2_core.tracking import run_tags, git_sha
from ragen2_core.types import PreparedBatch, RolloutBatch


def step_rng(seed: int, step: int, stream: int, rank: int = 0) -> np.random.Generator:
    """Independent, reproducible randomness per (seed, step, purpose, data-parallel rank)."""
    return np.random.default_rng([seed, step, stream, rank])


def agree(reason: str | None, world: int) -> str | None:
    """Rank 0's stop decision on every rank (only rank 0 evaluates), so all ranks leave together."""
    if world == 1:
        return reason
    box = [reason]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def total_over_ranks(n: int, world: int) -> int:
    """Sum of `n` over the data-parallel ranks (each rolls out and filters its own groups)."""
    if world == 1:
        return n
    # NCCL reduces CUDA tensors only; gloo takes CPU ones.
    nccl = torch.distributed.get_backend() == "nccl"
    box = torch.tensor([n], dtype=torch.long, device=f"cuda:{torch.cuda.current_device()}" if nccl else "cpu")
    torch.distributed.all_reduce(box)
    return int(box.item())


def build_objective(cfg) -> Objective:
    """The actor objective's numbers from the config; Dr.GRPO's length constant resolved here."""
    algo = cfg.algo
    norm_len = None
    if algo.loss_agg == "seq-mean-token-sum":
        turns = 1 if cfg.env.name in SINGLE_TURN_ENVS else cfg.env.max_turns
        norm_len = float(algo.loss_norm_len or turns * cfg.rollout.max_new_tokens)
    return Objective(clip_low=algo.clip_low, clip_high=algo.clip_high, clip_ratio_c=algo.clip_ratio_c,
                     agg=algo.loss_agg, norm_len=norm_len, entropy_coef=algo.entropy_coef, kl_coef=algo.kl_coef,
                     kl_estimator=algo.kl_estimator, kl_placement=algo.kl_placement,
                     scale_on=cfg.filter.loss_scale_on)


@dataclass
class Run:
    """What every stage of a run reads: the config, the models and the running state."""
    cfg: object
    sink: object
    rank: int
    world: int
    out_dir: Path
    actor: TrainEngine
    critic: TrainEngine | None
    reference: object | None    # the KL reference (train.engine.reference_policy), None without KL
    tok: object
    make_env: object
    template: str
    objective: Objective
    whiten: bool
    micro: int
    sampling: SamplingParams
    eval_sampling: SamplingParams
    monitor: StopMonitor
    policy_path: str
    fmt: object                 # raw text or the policy's chat template (rollout/prompt.py)
    vllm: object = None         # rollout.backend=vllm: the colocated engine
    # Running state that must survive a resume: the collapse EMAs and the cost counters.
    loop: dict = field(default_factory=lambda: {"collapse_ema": None, "cum_rollout_tokens": 0, "cum_wall_s": 0.0})


@dataclass
class Selection:
    """The filter's outcome for one step."""
    keep: torch.Tensor          # [G] bool
    kept_rows: list[int]
    scale: float                # loss_scale_factor of the kept ratio
    row_weight: torch.Tensor    # [B] soft reweighting (ones when off)


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
        if cfg.collapse.every and step % cfg.collapse.every == 0 and r.rank == 0:
            mi, reason = diagnose_collapse(r, step, batch)
            metrics |= mi

        # ============================================================ filter (SNR hook)
        t0 = time.perf_counter()
        sel, filter_metrics = filter_groups(r, step, batch, group_rewards)
        metrics |= filter_metrics
        kept_anywhere = total_over_ranks(int(sel.keep.sum()), r.world)
        reason = r.monitor.after_step(kept_groups=kept_anywhere,
                                      group_reward_std=metrics["rollout/group_reward_std"]) or reason
        metrics["filter/empty_streak"] = r.monitor.empty_streak

        # ============================================================ diagnostics: gradient probe
        if cfg.grad_probe.every and step % cfg.grad_probe.every == 0:
            metrics |= probe_gradients(r, batch, group_rewards, sel)
            t0 += metrics["time/grad_probe_s"]  # keep the probe out of the update's cost

        # ============================================================ advantage / loss / step
        # An empty selection skips the update; the stop monitor counts the streak. Under data
        # parallelism a rank whose filter kept nothing still joins the others' gradient all-reduce,
        # with one group at zero weight, so no rank waits forever.
        if sel.kept_rows:
            metrics |= update(r, batch.select(sel.kept_rows), sel.row_weight[sel.kept_rows], step, sel.scale)
        elif kept_anywhere:
            stand_in = [b for b, g in enumerate(batch.group_ids) if g == batch.group_ids[0]]
            update(r, batch.select(stand_in), sel.row_weight[stand_in], step, sel.scale, weight=0.0)
        if r.vllm and kept_anywhere:
            r.vllm.sync(r.actor.module)
        metrics["time/update_s"] = time.perf_counter() - t0

        # ============================================================ metrics: cost
        metrics |= cost_metrics(r, batch, sel.kept_rows, metrics)

        # ============================================================ eval
        if r.rank == 0 and cfg.train.eval_every and ((step + 1) % cfg.train.eval_every == 0 or step + 1 == cfg.train.steps):
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
        if cfg.train.checkpoint_every and (step + 1) % cfg.train.checkpoint_every == 0 and not reason:
            checkpoint.save(r.out_dir, step, r.actor, r.critic, keep=cfg.train.keep_checkpoints, rank=r.rank,
                            extra={"loop": r.loop, "stops": r.monitor.state_dict()})
        if reason:
            stop_reason = reason
            print(f"[train] early stop at step {step + 1}: {reason}", flush=True)
            break

    # ================================================================ export
    return export(r, step, stop_reason, metrics, last_eval)


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
            reference=reference, tok=tok, make_env=make_env, template=make_env().template_think,
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
    metrics = rollout_metrics(batch, group_rewards, rollout_tokens, r.template)
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


def filter_groups(r: Run, step: int, batch: RolloutBatch, group_rewards: torch.Tensor) -> tuple[Selection, dict]:
    """The SNR filter at this step's scheduled value, and `filter/*`."""
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
    return sel, {"filter/kept_ratio": kept_ratio, "filter/kept_groups": int(keep.sum()),
                 "filter/zero_std_groups": int(zero_spread(group_rewards).sum()),
                 "filter/kept_group_reward_std": float(spread[keep].mean()) if keep.any() else 0.0,
                 "filter/dropped_group_reward_std": float(dropped.mean()) if len(dropped) else float("nan"),
                 "filter/dropped_group_reward_std_max": float(dropped.max()) if len(dropped) else float("nan"),
                 "filter/value": value}


def probe_gradients(r: Run, batch: RolloutBatch, group_rewards: torch.Tensor, sel: Selection) -> dict:
    """Task / KL / entropy gradient components on the whole batch at the current parameters."""
    t0 = time.perf_counter()
    prep = prepare(r, batch, sel.row_weight, on_policy=True)
    spread = group_reward_stats(group_rewards, statistic="std")
    out = probe_batch(r.actor.module, prep, batch.group_ids, spread, objective=r.objective,
                      buckets=r.cfg.grad_probe.buckets, micro=r.micro, scale=sel.scale)
    return out | {"time/grad_probe_s": time.perf_counter() - t0}


def cost_metrics(r: Run, batch: RolloutBatch, kept_rows: list[int], metrics: dict) -> dict:
    """`cost/*`: tokens rolled out and kept, wall time per update, running sums (in the loop state)."""
    rollout_tokens = metrics["cost/rollout_tokens"]
    kept_tokens = sum(sum(batch.response_mask[b]) for b in kept_rows)
    wall_s = metrics["time/rollout_s"] + metrics["time/update_s"]
    r.loop["cum_rollout_tokens"] += rollout_tokens
    r.loop["cum_wall_s"] += wall_s
    return {"cost/rollout_tokens": rollout_tokens, "cost/kept_tokens": kept_tokens,
            "cost/tokens_per_kept_sample": rollout_tokens / len(kept_rows) if kept_rows else float("nan"),
            "cost/wasted_rollout_frac": 1.0 - kept_tokens / max(rollout_tokens, 1),
            "cost/wall_s_per_update": wall_s,
            "cost/cum_rollout_tokens": r.loop["cum_rollout_tokens"], "cost/cum_wall_s": r.loop["cum_wall_s"]}


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


def rollout_metrics(batch: RolloutBatch, group_rewards: torch.Tensor, rollout_tokens: int,
                    template: str) -> dict[str, float]:
    """`rollout/*` of the batch; `group_rewards` [G, S], `rollout_tokens` all reply tokens, `template`
    the env's input-independent reasoning sentence."""
    stats = batch_stats(batch, template)
    return {f"rollout/{k}": v for k, v in stats.items()} | {
        "rollout/group_reward_std": float(group_reward_stats(group_rewards, statistic="std").mean()),
        "rollout/frac_zero_std_groups": float(zero_spread(group_rewards).double().mean()),
        "rollout/response_tokens": rollout_tokens / len(batch),
        "rollout/truncated": sum(batch.truncated) / len(batch),
    } | {f"rollout/{k}": v for k, v in sandbox_metrics(i for infos in batch.step_infos for i in infos).items()}


def prepare(r: Run, batch: RolloutBatch, row_weight: torch.Tensor, *, on_policy: bool) -> PreparedBatch:
    """Padded tensors, behaviour and reference log-probs, and advantages for a batch.

    With ``on_policy`` (one epoch, one mini-batch) the behaviour log-probs are not scored here: the
    update's own forward pass gives them, since the parameters do not move before its single step.
    """
    algo, obj, actor = r.cfg.algo, r.objective, r.actor
    device = next(actor.module.parameters()).device
    t = {k: v.to(device) for k, v in batch.padded(r.tok.pad_token_id).items()}
    mask = t["response_mask"][:, 1:]            # next-token positions that are reply tokens
    share = dict(prefix_len=torch.tensor(batch.prompt_len, device=device),
                 groups=torch.tensor(batch.group_ids, device=device)
                 ) if r.cfg.train.shared_prefix else dict(prefix_len=None, groups=None)
    old_logp = old_entropy = ref_logp = old_values = returns = None
    if not on_policy or obj.kl_in_reward:
        old_logp, old_entropy = score_tokens(actor.module, t, r.micro, **share, logit_chunk=r.cfg.train.logit_chunk)
    if obj.uses_reference:
        ref_logp, _ = score_tokens(r.reference.module, t, r.micro, **share, logit_chunk=r.cfg.train.logit_chunk)
    rewards = rewards_with_kl(obj, t["token_rewards"][:, 1:], old_logp, ref_logp, mask)
    if r.critic is not None:
        old_values = score_values(r.critic.module, t, r.micro, **share)
        advantages, returns = gae_advantages(rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam)
    else:
        seq_adv = group_advantages(rewards.sum(-1), torch.tensor(batch.group_ids, device=device),
                                   norm_by_std=algo.advantage == "grpo")
        advantages = broadcast_to_tokens(seq_adv, mask)
    if r.whiten:
        advantages = whiten(advantages, mask)
    advantages = advantages * row_weight.to(device)[:, None]   # soft reweighting (ones when off)
    if r.cfg.filter.zero_task_advantage:
        advantages = torch.zeros_like(advantages)
    return PreparedBatch(input_ids=t["input_ids"], attention_mask=t["attention_mask"], mask=mask,
                         advantages=advantages, lengths=t["attention_mask"].sum(-1), old_logp=old_logp,
                         old_entropy=old_entropy, ref_logp=ref_logp, old_values=old_values, returns=returns, **share)


def read_floats(logs: dict[str, list]) -> dict[str, list[float]]:
    """The update's logged values as floats, tensors among them read from the device at once."""
    tensors = [x for v in logs.values() for x in v if isinstance(x, torch.Tensor)]
    read = iter(torch.stack([t.detach().double() for t in tensors]).tolist() if tensors else [])
    return {k: [next(read) if isinstance(x, torch.Tensor) else float(x) for x in v] for k, v in logs.items()}


def update(r: Run, batch: RolloutBatch, row_weight: torch.Tensor, step: int, scale: float,
           weight: float = 1.0) -> dict[str, float]:
    """Advantages, then ppo_epochs x mini_batches optimizer steps over the kept rows; `scale` is the
    filter's loss scale (`algo/objective.py` decides what it multiplies). `weight` 0 takes part in
    the steps without contributing (a data-parallel rank with nothing kept).

    Nothing in the micro-batch loop waits for the device: the micro-batches are planned on the host
    from the batch's own lists, and the metrics stay tensors until one read at the end."""
    algo, obj, actor, critic = r.cfg.algo, r.objective, r.actor, r.critic
    # ============================================================ advantage
    on_policy = algo.ppo_epochs == 1 and algo.mini_batches == 1
    p = prepare(r, batch, row_weight, on_policy=on_policy)
    mask, device = p.mask, p.input_ids.device
    cut = lambda x, rows, L: None if x is None else x[rows, :L - 1]  # noqa: E731
    lengths = np.array([len(ids) for ids in batch.token_ids])          # p.lengths, known on the host
    groups = None if p.groups is None else np.array(batch.group_ids)
    prompts: dict[tuple, int] = {}
    prompt_id = [prompts.setdefault(tuple(ids[:k]), len(prompts)) for ids, k in zip(batch.token_ids, batch.prompt_len)]
    plan = lambda rows: None if p.prefix_len is None else RowPlan(  # noqa: E731
        lengths=lengths[rows].tolist(), prefix_len=[batch.prompt_len[b] for b in rows],
        prompt=[prompt_id[b] for b in rows])

    # ============================================================ loss / step
    logs: dict[str, list] = {}
    # Pre-update entropy and KL, summed over reply tokens of the first pass (the scoring pass's
    # values when there was one): parameters only move at the accumulation boundary.
    sums: dict[str, list] = {"entropy": [], "kl": [], "tokens": []}
    B = len(batch)
    # During critic warm-up the actor's forward still runs (for its metrics) but it does not learn.
    train_actor = critic is None or step >= algo.critic_warmup
    for epoch in range(algo.ppo_epochs):
        order = step_rng(r.cfg.train.seed, step, 1 + epoch, actor.rank).permutation(B)
        for mb in np.array_split(order, algo.mini_batches):
            # Micro-batches of similar lengths, each cut to its own longest row: multi-turn
            # episodes differ several-fold in length, and padding would dominate the update.
            mb = mb[micro_batch_order(lengths[mb], None if groups is None else groups[mb])]
            for host_rows in np.array_split(mb, r.cfg.train.grad_accum):
                # An empty micro-batch still takes part, with zero weight, so DeepSpeed's
                # accumulation boundary stays aligned with the mini-batch.
                mb_weight = weight if len(host_rows) else 0.0
                host_rows = host_rows if len(host_rows) else mb[:1]
                L = int(lengths[host_rows].max())
                rows = upload(host_rows.tolist(), device)
                ids, attn, m_full = p.input_ids[rows, :L], p.attention_mask[rows, :L], mask[rows, :L - 1]
                prefix = None if p.prefix_len is None else p.prefix_len[rows]
                with torch.set_grad_enabled(train_actor):
                    logits, start = forward_window(actor.forward, ids, attn, prefix_len=prefix,
                                                   logit_chunk=r.cfg.train.logit_chunk, plan=plan(host_rows))
                    w = lambda x: None if x is None else window(x, start, logits.shape[1])  # noqa: E731
                    m = w(m_full)  # the actor's per-token tensors live in the logits' window
                    logp, entropy_tok = logp_entropy(logits, w(ids[:, 1:]))
                    terms = actor_terms(obj, logp, entropy_tok, m, w(cut(p.old_logp, rows, L)),
                                        w(p.advantages[rows, :L - 1]), w(cut(p.ref_logp, rows, L)), scale=scale)
                if train_actor:
                    actor.backward(terms["loss"] * mb_weight)
                    actor.step()
                if epoch == 0 and mb_weight and p.old_logp is None:
                    sums["entropy"].append((entropy_tok.detach() * m).sum())
                    if obj.uses_reference:
                        kl_tok = kl_penalty(logp.detach(), w(p.ref_logp[rows, :L - 1]), estimator=algo.kl_estimator)
                        sums["kl"].append((kl_tok * m).sum())
                    sums["tokens"].append(m.sum())
                for k in ("pg", "clipfrac", "clipfrac_lower", "approx_kl"):
                    logs.setdefault({"pg": "actor/pg_loss"}.get(k, f"actor/{k}"), []).append(terms[k].detach())
                if critic is not None:
                    v, v_start = forward_window(critic.forward, ids, attn, prefix_len=prefix, plan=plan(host_rows))
                    wv = lambda x: window(x, v_start, v.shape[1])  # noqa: E731
                    vloss, vstats = value_loss(v[..., 0], wv(cut(p.old_values, rows, L)), wv(cut(p.returns, rows, L)),
                                               wv(m_full), clip=algo.value_clip, agg=algo.loss_agg)
                    critic.backward(vloss * mb_weight)
                    critic.step()
                    logs.setdefault("critic/value_loss", []).append(vloss.detach())
                    logs.setdefault("critic/vf_clipfrac", []).append(vstats["vf_clipfrac"])
            logs.setdefault("actor/grad_norm", []).append(actor.last_grad_norm() if train_actor else float("nan"))

    # ============================================================ metrics
    values = read_floats(logs | {f"sum/{k}": v for k, v in sums.items()})
    total = lambda k: functools.reduce(operator.add, values.pop(f"sum/{k}"), 0.0)  # noqa: E731  in loop order
    ent_sum, kl_sum, n_tok = total("entropy"), total("kl"), total("tokens")
    out = {k: float(np.mean(v)) for k, v in values.items()}
    if p.old_logp is not None:
        out["actor/entropy"] = float(aggregate(p.old_entropy, mask, mode="token-mean"))
        kl = (kl_penalty(p.old_logp, p.ref_logp, estimator=algo.kl_estimator)
              if obj.uses_reference else None)
        out["actor/kl"] = float(aggregate(kl, mask, mode="token-mean")) if kl is not None else float("nan")
    else:
        out["actor/entropy"] = ent_sum / max(n_tok, 1.0)
        out["actor/kl"] = kl_sum / max(n_tok, 1.0) if obj.uses_reference else float("nan")
    out["actor/lr"] = actor.lr()
    if critic is None:
        out |= {"critic/value_loss": float("nan"), "critic/vf_clipfrac": float("nan")}
    return out


def sample_text(batch: RolloutBatch, tok, k: int) -> str:
    parts = []
    for b in range(min(k, len(batch))):
        parts.append(f"=== seed {batch.env_seeds[b]} success {batch.success[b]} reward "
                     f"{batch.episode_reward[b]:.2f}\n{tok.decode(batch.token_ids[b])}")
    return "\n\n".join(parts)
