"""Is the reasoning needed in a setting? The acceptance numbers of a base config's warm start.

    ragen2 setting-check sweeps/base/doors.yaml [--episodes 300] [--set key=value ...]
                                    [--out reports/out/setting_doors.json]
    ragen2 setting-check sweeps/base/doors.yaml --only mixed --set env.slip=0.25   # under noise

Three policies of the same warm-start recipe, each played once on the same validation seeds with
sampled decoding (the rollout's temperature), all built first if they are not cached or shipped:

  mixed          the config's own (its grounded_frac, after its grounded stage if it has one):
                 success of episodes whose first turn is grounded vs those whose first turn is the
                 template sentence
  grounded_only  the same recipe on grounded traces only (warmstart.grounded_frac=1)
  template_only  the same recipe on template traces only (warmstart.grounded_frac=0), as many steps

The first comparison says grounded reasoning goes with success; the second that it causes it (the
maps are the same, only the reasoning taught differs). Intervals: Wilson per proportion, Newcombe's
hybrid score interval per difference, 95 %.

Beside the play, each policy is read teacher-forced on expert episodes of the style it was taught
(the mixed one on both) over the same seeds: the share of turns whose whole reply is the greedy
next-token choice at every token, and of answers' first and second moves. That says which step a
policy gets wrong (a lookup in the reasoning, or composing lookups in the answer) where the
success rates only say that it does. And each played episode is replayed turn by turn: how often
the reasoning opens with the state as the expert reads it (doors: `Player: B.`), on the
first turn, after a move, and on turns whose state repeats the last because a door stuck; beside
it the expert's own success under the env's noise (`env.slip`), the ceiling for any policy.
Prints Markdown tables and writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ragen2_core.atomic import write_text_atomic
from ragen2_core.config import ConfigError, load_config
from ragen2_core.report import stats

VARIANTS = ("mixed", "grounded_only", "template_only")


def variant_overrides(cfg) -> dict[str, list[str]]:
    """The overrides that turn the config's recipe into each policy. The one-style policies get the
    same number of steps as each other: a curriculum's grounded stage (grounded_steps) when there is
    one, which makes grounded_only that very stage (the same cached policy), else ``steps``."""
    w = cfg.warmstart
    steps = w.grounded_steps or w.steps
    one_style = ["warmstart.grounded_steps=0", f"warmstart.steps={steps}"]
    return {"mixed": [], "grounded_only": ["warmstart.grounded_frac=1.0", *one_style],
            "template_only": ["warmstart.grounded_frac=0.0", *one_style]}


def play(cfg) -> dict:
    """Sampled validation of the config's policy: counts overall and by the first turn's style."""
    import torch

    from ragen2_core.envs.registry import env_factory
    from ragen2_core.policy.load import load_policy
    from ragen2_core.rollout.sampler import SamplingParams
    from ragen2_core.rollout.evaluate import evaluate, think_text, val_seeds
    from ragen2_core.rollout.prompt import load_prompt_format

    torch.set_num_threads(cfg.train.threads or 1)
    model, tok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    make_env = env_factory(cfg.env)
    sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                              max_new_tokens=cfg.rollout.max_new_tokens,
                              max_context_tokens=cfg.rollout.max_context_tokens, greedy=False)
    prompt_format, seeds = load_prompt_format(tok, cfg.policy.chat_template), val_seeds(cfg.env)
    t0 = time.time()
    summary, batch = evaluate(model, tok, make_env, seeds=seeds, sampling=sampling, seed=cfg.train.seed, prompt_format=prompt_format)
    frac = cfg.warmstart.grounded_frac
    taught = ["grounded"] if frac == 1 else ["template"] if frac == 0 else ["grounded", "template"]
    forced = {style: teacher_forced(model, tok, make_env, seeds, style, prompt_format) for style in taught}
    template = make_env().template_think
    first_template = [bool(rs) and think_text(rs[0]) == template for rs in batch.responses]
    by_style = {}
    for style, want in (("grounded", False), ("template", True)):
        wins = [ok for t, ok in zip(first_template, batch.success) if t == want]
        by_style[style] = {"successes": int(sum(wins)), "episodes": len(wins)}
    return {"policy": str(path), "episodes": len(batch), "successes": int(sum(batch.success)),
            "template_frac": summary["template_frac"], "first_turn": by_style, "teacher_forced": forced,
            "expert_ceiling": expert_ceiling(make_env, seeds), "state_read": state_reading(make_env, seeds, batch.responses),
            "seconds": round(time.time() - t0, 1)}


def expert_ceiling(make_env, seeds) -> float | None:
    """Mean over the seeds of the expert's exact chance of success under the env's noise (slip):
    the most any policy can score. None for envs that do not compute it."""
    env = make_env()
    if not hasattr(env, "expert_success"):
        return None
    total = 0.0
    for seed in seeds:
        env.reset(seed)
        total += env.expert_success()
    return total / len(seeds)


def state_reading(make_env, seeds, responses) -> dict:
    """Replays each played episode (the same seeds and dynamics as the play) and asks of every
    grounded turn whether its reasoning opens with the expert's first sentence for the state it was
    in (doors: ``Player: B.``): reading the state, apart from planning. Turns are split into
    the first, those after a move, and those whose state repeats the turn before (a door stuck:
    at slip 0 no expert trace shows one). {kind: {"right", "turns"}}."""
    from ragen2_core.rollout.evaluate import think_text

    template = make_env().template_think
    out: dict = {}
    for seed, replies in zip(seeds, responses):
        env = make_env()
        env.reset(seed, dynamics_seed=seed)
        before = None
        for k, reply in enumerate(replies):
            state = env.render()
            kind = "first turn" if k == 0 else "state repeated" if state == before else "after a move"
            think = think_text(reply)
            if think and think != template:
                head = env.expert_turn("grounded").think.split(". ")[0] + "."
                tally = out.setdefault(kind, {"right": 0, "turns": 0})
                tally["right"] += think.startswith(head)
                tally["turns"] += 1
            before = state
            if env.step(reply).done:
                break
    return out


def teacher_forced(model, tok, make_env, seeds, style: str, prompt_format) -> dict:
    """Greedy next-token accuracy on expert episodes of ``style``, per turn: the whole reply, and each
    answer move (every token of that move right, given the expert's prefix)."""
    import torch

    from ragen2_core.policy.warmstart import expert_episode

    whole, moves = [], {}
    for seed in seeds:
        ids, replies = [], []
        for chunk, reply in expert_episode(make_env(), seed, style, prompt_format):
            ids += tok.encode(chunk, add_special_tokens=False)
            enc = tok(reply, add_special_tokens=False, return_offsets_mapping=True)
            replies.append((len(ids), reply, enc["offset_mapping"]))
            ids += enc["input_ids"]
        with torch.no_grad():
            pred = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
        right = [True] + [pred[t - 1] == ids[t] for t in range(1, len(ids))]  # token t predicted at t - 1
        for base, reply, offsets in replies:
            whole.append(all(right[base:base + len(offsets)]))
            start = reply.index("<answer>") + len("<answer>")
            for k, move in enumerate(reply[start:reply.index("</answer>")].split(" || ")):
                lo = reply.index(move, start)
                start = lo + len(move)
                span = [base + j for j, (a, b) in enumerate(offsets) if a < start and b > lo]
                moves.setdefault(k, []).append(all(right[t] for t in span))
    return {"turns": len(whole), "reply_right": sum(whole) / len(whole),
            "move_right": {str(k + 1): sum(v) / len(v) for k, v in sorted(moves.items())}}


def _pct(est: stats.Estimate) -> str:
    if est.value is None:
        return stats.DASH
    return f"{100 * est.value:.1f} [{100 * est.low:.1f}, {100 * est.high:.1f}]"


def _rate(r: dict) -> str:
    """Success % of {"successes", "episodes"} with its Wilson interval."""
    return _pct(stats.wilson_ci(r["successes"], r["episodes"]))


def _versus(label: str, a: dict, b: dict) -> str:
    """A comparison row: both rates and their difference (Newcombe)."""
    diff = stats.proportion_diff_ci(a["successes"], a["episodes"], b["successes"], b["episodes"])
    return f"| {label} | {_rate(a)} vs {_rate(b)} | {_pct(diff)} |"


def table(results: dict) -> str:
    rows = ["| policy | episodes | success % [95 % CI] | template share of turns |", "| --- | --- | --- | --- |"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['episodes']} | {_rate(r)} | {r['template_frac']:.2f} |")
    rows += ["", "| comparison | success % | difference, points [95 % CI] |", "| --- | --- | --- |"]
    if "mixed" in results:  # (a) needs the mixed policy alone, (b) the two one-style ones
        g, t = results["mixed"]["first_turn"]["grounded"], results["mixed"]["first_turn"]["template"]
        rows.append(_versus(f"mixed policy: grounded first turn ({g['episodes']}) vs template first turn "
                            f"({t['episodes']})", g, t))
    if "grounded_only" in results and "template_only" in results:
        rows.append(_versus("grounded-only vs template-only warm start", results["grounded_only"],
                            results["template_only"]))
    rows += ["", "| policy | expert style read | turns | whole reply right | move 1 right | move 2 right |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        for style, f in r.get("teacher_forced", {}).items():
            m = f["move_right"]
            rows.append(f"| {name} | {style} | {f['turns']} | {100 * f['reply_right']:.1f} % | "
                        f"{100 * m.get('1', float('nan')):.1f} % | {100 * m.get('2', float('nan')):.1f} % |")
    return "\n".join(rows)


def reading_table(results: dict) -> str:
    """Per policy played: the expert's ceiling under the env's noise, and how often the reasoning
    reads the state right, by kind of turn."""
    kinds = ("first turn", "after a move", "state repeated")
    rows = ["| policy | success % | expert ceiling % | " + " | ".join(f"state read right: {k}" for k in kinds) + " |",
            "| --- | --- | --- |" + " --- |" * len(kinds)]
    for name, r in results.items():
        ceiling = r.get("expert_ceiling")
        reads = []
        for k in kinds:
            t = r.get("state_read", {}).get(k)
            reads.append(f"{_pct(stats.wilson_ci(t['right'], t['turns']))} of {t['turns']}" if t else stats.DASH)
        rows.append(f"| {name} | {_rate(r)} | "
                    f"{stats.DASH if ceiling is None else f'{100 * ceiling:.1f}'} | " + " | ".join(reads) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="base config, e.g. sweeps/base/doors.yaml")
    ap.add_argument("--episodes", type=int, default=300, help="validation seeds played per policy (default 300)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--only", choices=VARIANTS, action="append", help="play only these policies")
    ap.add_argument("--out", help="JSON file for the numbers (default reports/out/setting_<config>.json)")
    args = ap.parse_args(argv)
    try:
        extras = variant_overrides(load_config(args.config, args.overrides))
        cfgs = {name: load_config(args.config, [*args.overrides, *extra, f"env.val_seeds={args.episodes}"])
                for name, extra in extras.items() if not args.only or name in args.only}
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    results = {}
    for name, cfg in cfgs.items():
        print(f"[setting_check] {name}: building (if needed) and playing {args.episodes} episodes", flush=True)
        results[name] = play(cfg)
        print(f"[setting_check] {name}: {json.dumps(results[name])}", flush=True)
    out = Path(args.out or Path("reports/out") / f"setting_{Path(args.config).stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps({"config": args.config, "overrides": args.overrides, "results": results},
                                      indent=2))
    print(table(results))
    print(reading_table(results))
    print(f"numbers: {out}")
    return 0

