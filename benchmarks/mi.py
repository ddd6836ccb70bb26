"""MI diagnostic cost: cached cross-scoring vs one forward per pair, and its share of training time.

On the embedded default policy (sweeps/base/frozenlake_tiny.yaml), one real rollout of N = 8 groups
(distinct env seeds) x K = 4 episodes with the agent prompts, sampled as in training; then, in one
process, back to back:
  efficient   ragen2_core.rollout.cross_score.cross_score (each context encoded once, KV reused)
  naive       cross_score_naive (context + reasoning re-encoded for each of the N*K*N pairs)
  collapse    the whole diagnostic as the trainer runs it: score_batch + collapse_metrics
  step        ragen2_core.train.trainer.run for 2 steps, eval and MI off: mean time/step_s
``ratio`` = naive s / efficient s (goal >= 5); ``overhead_frac`` = collapse_s / (every * step_s +
collapse_s) with every = collapse.every (default 5), the fraction of training wall time the
diagnostic adds (goal <= 0.10); ``max_abs_diff`` between the two scorers must be <= 1e-5.
The last line printed is one JSON object.

    python benchmarks/mi.py [--threads 2] [--repeats 2] [--skip-step] [--set k=v ...]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch

from ragen2_core.config import load_config
from ragen2_core.envs.registry import env_factory
from ragen2_core.metrics.collapse import collapse_metrics
from ragen2_core.policy.load import load_policy
from ragen2_core.rollout.cross_score import cross_score, cross_score_naive, first_turn_reasonings, score_batch
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import SamplingParams

N, K = 8, 4


def timed(fn, repeats: int = 1):
    """(best seconds, result of the last run)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="sweeps/base/frozenlake_tiny.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="best of N for the efficient scorer and the diagnostic")
    ap.add_argument("--skip-step", action="store_true", help="do not time training steps (no overhead_frac)")
    args = ap.parse_args()
    cfg = load_config(args.config, [f"train.threads={args.threads}", *args.overrides])
    torch.set_num_threads(args.threads)
    model, tok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    model.eval()

    rc = cfg.rollout
    rng = np.random.default_rng(cfg.train.seed)
    group_seeds = rng.choice(cfg.env.val_seed_start, N, replace=False).tolist()
    sampling = SamplingParams(temperature=rc.temperature, top_p=rc.top_p, top_k=rc.top_k,
                              max_new_tokens=rc.max_new_tokens, max_context_tokens=rc.max_context_tokens)
    t_roll, batch = timed(lambda: rollout(
        model, tok, env_factory(cfg.env), env_seeds=[s for s in group_seeds for _ in range(K)],
        dynamics_seeds=rng.integers(0, 2**31 - 1, N * K).tolist(),
        group_ids=[g for g in range(N) for _ in range(K)], sampling=sampling,
        generator=torch.Generator().manual_seed(cfg.train.seed)))
    contexts, reasonings = first_turn_reasonings(batch, list(range(N * K)))
    contexts = contexts[::K]
    ctx_len, z_len = np.mean([len(c) for c in contexts]), np.mean([len(z) for z in reasonings])
    print(f"policy {path}; rollout {N}x{K} in {t_roll:.1f} s; context {ctx_len:.0f} tokens, "
          f"reasoning {z_len:.1f} tokens on average (max {max(map(len, reasonings))})", flush=True)

    cc = cfg.collapse
    eff_s, fast = timed(lambda: cross_score(model, contexts, reasonings, k=K, token_budget=cc.token_budget),
                        args.repeats)
    print(f" efficient: {eff_s:7.3f} s", flush=True)
    naive_s, slow = timed(lambda: cross_score_naive(model, contexts, reasonings, k=K))
    print(f"     naive: {naive_s:7.3f} s  ({naive_s / eff_s:.1f}x)", flush=True)
    max_abs_diff = (fast - slow).abs().max().item()
    print(f"max |efficient - naive| = {max_abs_diff:.2e}", flush=True)

    def diagnostic():
        scores, lengths, _ = score_batch(model, batch, n_prompts=cc.n_prompts, k_samples=cc.k_samples,
                                         rng=np.random.default_rng(0), trajectory=cc.trajectory,
                                         token_budget=cc.token_budget)
        return collapse_metrics(scores, lengths=lengths, n_perm=cc.n_perm, seed=0)
    collapse_s, mi = timed(diagnostic, args.repeats)
    print(f"  collapse: {collapse_s:7.3f} s  (score_batch + collapse_metrics; mi {mi['mi']:.3f}, "
          f"z {mi['mi_zscore']:.2f}, permutation z {mi['mi_perm_zscore']:.2f}, retrieval {mi['retrieval_acc']:.2f})", flush=True)

    step_s = overhead = None
    every = cc.every or 5
    if not args.skip_step:
        from ragen2_core.tracking import MemorySink
        from ragen2_core.train.trainer import run
        with tempfile.TemporaryDirectory() as out:
            step_cfg = load_config(args.config, [f"train.threads={args.threads}", *args.overrides,
                                                 "train.steps=2", "train.eval_every=0", "collapse.every=0",
                                                 f"train.output_dir={out}"])
            sink = MemorySink()
            run(step_cfg, sink)
        step_s = float(np.mean([m["time/step_s"] for _, m in sink.metrics]))
        overhead = collapse_s / (every * step_s + collapse_s)
        print(f"      step: {step_s:7.3f} s  (mean of 2; {rc.n_groups}x{rc.group_size} episodes); MI every "
              f"{every} steps adds {100 * overhead:.1f} % of wall time", flush=True)

    print(json.dumps({
        "name": "mi_cross_score", "policy": str(path), "threads": args.threads, "n_prompts": N, "k_samples": K,
        "ratio": round(naive_s / eff_s, 2), "goal": 5.0,
        "overhead_frac": None if overhead is None else round(overhead, 4), "overhead_goal": 0.10,
        "max_abs_diff": max_abs_diff, "efficient_s": round(eff_s, 3), "naive_s": round(naive_s, 3),
        "collapse_s": round(collapse_s, 3), "step_s": None if step_s is None else round(step_s, 3),
        "collapse_every": every, "context_tokens": round(float(ctx_len), 1),
        "reasoning_tokens": round(float(z_len), 1)}))


if __name__ == "__main__":
    main()
