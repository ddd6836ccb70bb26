"""The ``ragen2`` command.

    ragen2 train --config FILE [--set key=value ...] [--tracking-uri URI] [--resume] [--no-memory-check]
    ragen2 eval [--config FILE] [--set key=value ...] [--episodes N] [--sample] [--show K]
    ragen2 warmstart [--config FILE] [--set key=value ...] [--rebuild] [--ship]   # locate (cached, shipped) or build the embedded policy
    ragen2 config [--config FILE] [--set key=value ...] [--describe]
    ragen2 mi --rollouts FILE --model PATH_OR_NAME [...]       # MI proxy on dumped rollouts, see docs/mi.md
    ragen2 sweep SPEC.yaml [--dry-run] [--resume] [...]      # = python sweeps/run.py, see docs/sweeps.md
    ragen2 ui [--experiment NAME] [--port 5000]               # MLflow UI on the project's store, loopback only
    ragen2 report --experiment NAME [--tracking-uri URI] [--out FILE.pdf]   # see docs/reports.md
    ragen2 study SWEEP_OR_ARCHIVE... [--reference SWEEP]     # a study's tables (docs/reproduction.md)
    ragen2 power PILOT_SWEEP [--episodes 300] [--seeds 10]    # its power plan
    ragen2 setting-check BASE.yaml [--episodes 300]           # is the reasoning needed there?

Bad configuration prints every error (field, value, fix) and exits with status 2 before any work;
so does any other bad input a command can check up front (train/preflight.py): it creates nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ragen2_core.atomic import write_text_atomic
from ragen2_core.config import ConfigError, describe, dump_yaml, load_config


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML training config (default: built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, repeatable, e.g. --set rollout.group_size=4")


def _threads(cfg) -> None:
    import torch
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)


def cmd_config(cfg, args) -> int:
    print(describe() if args.describe else dump_yaml(cfg), end="")
    return 0


def _refuse(command: str, problems: list[str]) -> int:
    print(f"ragen2 {command}: cannot start:\n" + "\n".join(f"  - {p}" for p in problems), file=sys.stderr)
    return 2


def cmd_warmstart(cfg, args) -> int:
    from ragen2_core.train.preflight import warmstart_preflight

    problems = warmstart_preflight(cfg)
    if problems:
        return _refuse("warmstart", problems)
    from ragen2_core.policy.warmstart import embedded_policy_path, find_policy, ship
    if cfg.policy.model != "embedded":
        return _warmstart_pretrained(cfg, args)
    _threads(cfg)
    t0 = time.time()
    _, where = find_policy(cfg.policy, cfg.warmstart, cfg.env)
    path = embedded_policy_path(cfg.policy, cfg.warmstart, cfg.env, rebuild=args.rebuild)
    how = "built" if args.rebuild or where == "missing" else where
    print(f"policy: {path} ({how}, {time.time() - t0:.1f}s)")
    if args.ship:
        shipped = ship(path)
        size = sum(f.stat().st_size for f in shipped.iterdir())
        print(f"shipped: {shipped} ({size / 2**20:.1f} MB); commit it to the repository")
    return 0


def _warmstart_pretrained(cfg, args) -> int:
    from ragen2_core.policy.gguf import resolve_model
    base = resolve_model(cfg.policy.model, cfg.policy.cache_dir)
    if not (cfg.warmstart.enabled and cfg.warmstart.pretrained):
        print(f"policy: {base} (a pretrained model with warmstart.pretrained=false: nothing to build)")
        return 0
    from ragen2_core.policy.format_warmstart import format_policy_path
    _threads(cfg)
    t0 = time.time()
    path = format_policy_path(base, cfg.policy, cfg.warmstart, cfg.env, rebuild=args.rebuild)
    print(f"policy: {path} (format warm start of {cfg.policy.model}, {time.time() - t0:.1f}s)")
    return 0


def cmd_eval(cfg, args) -> int:
    from ragen2_core.train.preflight import eval_preflight

    problems = eval_preflight(cfg)
    if args.episodes < 0 or args.episodes > cfg.env.val_seeds:
        problems.append(f"--episodes {args.episodes}: the validation set holds env.val_seeds={cfg.env.val_seeds} "
                        f"seeds; give 0 (all) to {cfg.env.val_seeds}, or a larger set with --set env.val_seeds=N")
    if args.show < 0:
        problems.append(f"--show {args.show}: the trajectories to print, >= 0")
    if problems:
        return _refuse("eval", problems)
    from ragen2_core.envs.registry import env_factory
    from ragen2_core.policy.load import load_policy
    from ragen2_core.rollout.sampler import SamplingParams
    from ragen2_core.rollout.evaluate import evaluate, random_baseline, val_seeds
    from ragen2_core.rollout.prompt import load_prompt_format
    _threads(cfg)
    model, tok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    make_env = env_factory(cfg.env)
    seeds = val_seeds(cfg.env)[: args.episodes or None]
    sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                              top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens,
                              max_context_tokens=cfg.rollout.max_context_tokens, greedy=not args.sample)
    t0 = time.time()
    stats, batch = evaluate(model, tok, make_env, seeds=seeds, sampling=sampling, seed=cfg.train.seed,
                            prompt_format=load_prompt_format(tok, cfg.policy.chat_template))
    stats["seconds"] = round(time.time() - t0, 2)
    stats["random_policy_success"] = random_baseline(make_env, seeds=seeds)["success"]
    stats |= _intervals(stats, episodes=len(seeds), turns=sum(batch.n_turns))
    print(f"policy {path} on {cfg.env.name} (slip {cfg.env.slip}), {len(seeds)} validation seeds, "
          f"{'sampled' if args.sample else 'greedy'}:")
    print(json.dumps(stats, indent=2))
    for b in range(min(args.show, len(batch))):
        print(f"\n--- sample {b} (seed {batch.env_seeds[b]}, success {batch.success[b]}, "
              f"reward {batch.episode_reward[b]:.2f}) ---")
        print(tok.decode(batch.token_ids[b]))
    return 0


def _intervals(stats: dict, *, episodes: int, turns: int) -> dict:
    """95 % Wilson intervals of the shares `ragen2 eval` prints. The format-valid one counts turns as
    independent (turns of one episode are not), so it is narrower than the truth."""
    from ragen2_core.report.stats import wilson_ci

    def ci(share, n):
        e = wilson_ci(round(share * n), n)
        return [round(e.low, 4), round(e.high, 4)]
    out = {"success_ci95": ci(stats["success"], episodes), "format_valid_ci95": ci(stats["format_valid"], turns)}
    if stats["random_policy_success"] is not None:
        out["random_policy_success_ci95"] = ci(stats["random_policy_success"], episodes)
    return out


def cmd_train(cfg, args) -> int:
    from ragen2_core.train.preflight import preflight

    # before the output directory, the MLflow store and DeepSpeed exist (or are even imported)
    problems = preflight(cfg, memory_check=not args.no_memory_check)
    if problems:
        return _refuse("train", problems)
    from ragen2_core.train.trainer import run
    from ragen2_core.train.engine import shutdown_distributed
    code = _train(cfg, run)
    shutdown_distributed()  # after a clean end only: after an error a peer rank may be gone, and a destroy could wait on it
    return code


def _train(cfg, run) -> int:
    from ragen2_core.tracking import FanoutSink, JsonlSink, MemorySink, MlflowSink, StdoutSink
    out = Path(cfg.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if int(os.environ.get("RANK", "0")) > 0:  # under torchrun only rank 0 reports
        run(cfg, MemorySink())
        return 0
    run_file = out / "mlflow_run.json"
    # A resumed run continues its own MLflow run, so the metric history stays one run.
    run_id = json.loads(run_file.read_text())["run_id"] if cfg.train.resume and run_file.exists() else None
    mlflow = MlflowSink(tracking_uri=cfg.tracking.uri, experiment=cfg.tracking.experiment,
                        run_name=cfg.tracking.run_name, run_id=run_id)
    write_text_atomic(run_file, json.dumps({"run_id": mlflow.run_id, "tracking_uri": mlflow.tracking_uri}))
    sink = FanoutSink(StdoutSink(total_steps=cfg.train.steps), JsonlSink(out / "metrics.jsonl"), mlflow)
    with sink:
        result = run(cfg, sink)
    print(f"done ({result['stop_reason']} after {result['steps_done']} steps): "
          f"eval/success {result.get('eval/success', float('nan')):.3f}; policy {result['policy_dir']}; "
          f"MLflow run {mlflow.run_id} at {mlflow.tracking_uri} (browse: mlflow ui --backend-store-uri "
          f"{mlflow.tracking_uri})")
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "warmstart": cmd_warmstart, "config": cmd_config}


# Commands that take their own arguments, no training config: name -> (module with main(argv), what it does).
OWN_ARGS = {
    "mi": ("ragen2_core.mi_offline", "MI proxy of dumped rollouts under any causal LM"),
    "sweep": ("ragen2_core.sweep.driver", "run a sweep spec on Ray Tune, recorded in MLflow"),
    "ui": ("ragen2_core.ui", "MLflow UI on the project's store, loopback only"),
    "report": ("ragen2_core.report.build", "comparative PDF report of a sweep from MLflow"),
    "study": ("ragen2_core.report.study", "tables and figures of a multi-sweep study (docs/reproduction.md)"),
    "power": ("ragen2_core.report.power", "seeds and validation episodes a study needs, from its pilots"),
    "setting-check": ("ragen2_core.report.setting_check", "is the reasoning needed in a setting? (acceptance numbers)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in OWN_ARGS:  # no training config, only their own arguments
        import importlib
        return importlib.import_module(OWN_ARGS[argv[0]][0]).main(argv[1:])
    parser = argparse.ArgumentParser(prog="ragen2", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a policy with RL (PPO / GRPO / Dr.GRPO)")
    _config_args(p)
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite file mlflow.db here)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in train.output_dir")
    p.add_argument("--no-memory-check", action="store_true",
                   help="start even when the batch's estimated memory exceeds this machine's (train/preflight.py)")
    p = sub.add_parser("eval", help="run the policy on the validation seeds")
    _config_args(p)
    p.add_argument("--episodes", type=int, default=0, help="first N validation seeds (0 = all)")
    p.add_argument("--sample", action="store_true", help="sample with the rollout settings (default greedy)")
    p.add_argument("--show", type=int, default=2, help="print this many trajectories")
    p = sub.add_parser("warmstart", help="locate (cached, shipped) or build the embedded policy")
    _config_args(p)
    p.add_argument("--rebuild", action="store_true",
                   help="build it from scratch into policy.cache_dir even if a cached or shipped copy exists")
    p.add_argument("--ship", action="store_true",
                   help="copy the policy into ragen2_core/policy/shipped/, where a fresh clone finds it")
    p = sub.add_parser("config", help="print the resolved config (or --describe every field)")
    _config_args(p)
    p.add_argument("--describe", action="store_true")
    for name, (_, what) in OWN_ARGS.items():
        sub.add_parser(name, help=f"{what} (ragen2 {name} --help)", add_help=False)
    args = parser.parse_args(argv)
    try:
        extra = [f"tracking.uri={args.tracking_uri}"] if getattr(args, "tracking_uri", None) else []
        extra += ["train.resume=true"] if getattr(args, "resume", False) else []
        cfg = load_config(args.config, list(args.overrides) + extra)
    except ConfigError as err:
        print(f"ragen2 {args.command}: invalid configuration:\n{err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"ragen2 {args.command}: {err}", file=sys.stderr)
        return 2
    return COMMANDS[args.command](cfg, args)


if __name__ == "__main__":
    sys.exit(main())
