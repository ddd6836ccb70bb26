"""``ragen2 mi``: the template-collapse metrics of dumped rollouts, scored by any causal LM.

    ragen2 mi --rollouts runs/x/rollouts.jsonl --model runs/x/policy [--step S] [--n-prompts 8]
              [--k-samples 4] [--n-perm 32] [--seed 0] [--trajectory] [--ids]
              [--token-budget 16384] [--threads N] [--chat-template auto|none|PATH]

Reads the episodes of one step (default: the last step in the file; training writes the file with
``collapse.dump_rollouts=true``), picks N groups with distinct prompts and K episodes in each,
re-tokenises their texts with the scorer's tokenizer (``--ids`` scores the stored token ids instead,
which reproduces the in-training numbers exactly when ``--model`` is the policy that rolled them
out), cross-scores every reasoning under every prompt and prints each metric with what it costs:
cond_entropy needs only each reasoning under its own prompt (N*K sequences), every MI-type metric
all N*K*N. The last line is one JSON object. Errors (missing file, a file over the data-file size cap
of ``envs/math.py``, bad line, unknown step, fewer than 2 groups, unloadable model, unusable chat
template, a seed outside 0 .. 2**32 - 1) print one message and exit with status 2.

The prompt is rendered in the scorer's own conversation format, as training renders it:
``--chat-template auto`` (default) uses the scorer tokenizer's chat template when it has one, else
raw text; ``none`` raw text; a path that jinja file. Files written before the ``system``/``user``
fields are scored with their stored context text.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ragen2_core.config import MAX_SEED
from ragen2_core.envs.math import data_size_problem
from ragen2_core.metrics.collapse import collapse_metrics
from ragen2_core.rollout.cross_score import DEFAULT_TOKEN_BUDGET, cross_score, pick_rows
from ragen2_core.rollout.dump import load_rollouts
from ragen2_core.rollout.prompt import RAW, TemplateError, load_prompt_format

# What each metric of collapse_metrics is computed from; the rest need the full cross-scores.
MATCHED_ONLY = {"cond_entropy", "cond_entropy_per_token"}
FREE = {"mi_upper_bound", "retrieval_chance"}


class MIError(Exception):
    """A problem with the user's input: reported in one line, exit status 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rollouts", required=True, help="JSONL written with collapse.dump_rollouts=true")
    p.add_argument("--model", required=True, help="scorer: a policy directory or an HF name / path")
    p.add_argument("--step", type=int, default=None, help="training step to score (default: the last in the file)")
    p.add_argument("--n-prompts", type=int, default=8, help="N: groups (distinct prompts) cross-scored")
    p.add_argument("--k-samples", type=int, default=4, help="K: reasonings per prompt")
    p.add_argument("--n-perm", type=int, default=32, help="prompt permutations for the z-score null")
    p.add_argument("--seed", type=int, default=0, help="seed for picking groups and permutations")
    p.add_argument("--trajectory", action="store_true", help="score every turn's reasoning, concatenated")
    p.add_argument("--ids", action="store_true",
                   help="score the stored token ids, not re-tokenised text (only with the policy's tokenizer)")
    p.add_argument("--token-budget", type=int, default=DEFAULT_TOKEN_BUDGET, help="rows x tokens per forward")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = torch default")
    p.add_argument("--chat-template", default="auto",
                   help="prompt format: auto (the scorer's chat template if it has one), none, or a jinja file")


def _check_file(path: Path) -> None:
    """Within the data-file size cap and UTF-8, read line by line."""
    if not path.is_file():
        return  # load_rollouts says how to get one
    too_big = data_size_problem(path)
    if too_big:
        raise MIError(too_big)
    with path.open("rb") as f:
        for n, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise MIError(f"{path}:{n}: not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1}); "
                              "a rollouts file is UTF-8 JSON lines, as training writes it.") from None


def _check_ids(path: Path, episodes: list[dict]) -> None:
    """``step`` and ``group_id`` must be whole numbers: they select and group the episodes."""
    with path.open("rb") as f:
        lines = [n for n, line in enumerate(f, start=1) if line.strip()]
    for rec, n in zip(episodes, lines):
        for field in ("step", "group_id"):
            value = rec.get(field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise MIError(f"{path}:{n}: {field} is {json.dumps(value)}; it must be a whole number "
                              "(format in ragen2_core/rollout/dump.py).")


def select_step(episodes: list[dict], step: int | None) -> tuple[int, list[dict]]:
    steps = sorted({int(e["step"]) for e in episodes})
    if not steps:
        raise MIError("the rollouts file holds no episodes.")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise MIError(f"--step {step} is not in the file; steps present: {steps}.")
    return step, [e for e in episodes if int(e["step"]) == step]


def load_scorer(name: str):
    from ragen2_core.policy.model import load_pretrained
    try:
        # Reads our embedded tokenizer exactly (see load_pretrained); anything else via AutoTokenizer.
        model, tok = load_pretrained(name)
    except (OSError, ValueError) as err:
        raise MIError(f"cannot load --model {name!r}: {str(err).splitlines()[0]}. Pass a policy directory "
                      f"(e.g. runs/x/policy) or an HF model name.") from None
    return model.eval(), tok


def token_lists(eps: list[dict], tok, *, trajectory: bool, ids: bool, prompt_format=RAW) -> tuple[list, list]:
    """(contexts, reasonings) as token lists under the scorer's tokenizer (or the stored ids)."""
    if ids:
        missing = [e for e in eps if trajectory and "reasonings_ids" not in e]
        if missing:
            raise MIError("--ids --trajectory needs the field reasonings_ids, which this file lacks.")
        return ([list(e["context_ids"]) for e in eps],
                [[t for z in e["reasonings_ids"] for t in z] if trajectory else list(e["reasoning_ids"])
                 for e in eps])
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    if prompt_format is not RAW and all("system" in e for e in eps):
        # A template writes its own BOS if it has one, as the rollout's first piece did.
        contexts = [enc(prompt_format.start(e["system"], e["user"]).text) for e in eps]
    else:
        # Raw text is the start of the sequence, so it gets whatever the tokenizer prepends (a BOS).
        contexts = [tok.encode(e["context"]) for e in eps]
    reasonings = [[t for z in e["reasonings"] for t in enc(z)] if trajectory else enc(e["reasoning"])
                  for e in eps]
    return contexts, reasonings


def timed_score(model, contexts, reasonings, k: int, budget: int) -> tuple[torch.Tensor, float, int]:
    """(scores, seconds, tokens fed: each context once + each reasoning once per context)."""
    t0 = time.perf_counter()
    scores = cross_score(model, contexts, reasonings, k=k, token_budget=budget)
    tokens = sum(map(len, contexts)) + len(contexts) * sum(map(len, reasonings))
    return scores, time.perf_counter() - t0, tokens


def run(args: argparse.Namespace) -> int:
    for flag, value, least in (("--k-samples", args.k_samples, 1), ("--n-perm", args.n_perm, 2),
                               ("--token-budget", args.token_budget, 1), ("--n-prompts", args.n_prompts, 2)):
        if value < least:
            raise MIError(f"{flag} must be >= {least}; got {value}.")
    if not 0 <= args.seed <= MAX_SEED:
        raise MIError(f"--seed must be between 0 and {MAX_SEED}; got {args.seed}.")
    if args.threads:
        torch.set_num_threads(args.threads)
    _check_file(Path(args.rollouts))
    try:
        episodes = load_rollouts(args.rollouts)
    except (FileNotFoundError, ValueError) as err:
        raise MIError(str(err)) from None
    _check_ids(Path(args.rollouts), episodes)
    step, eps = select_step(episodes, args.step)
    n_groups = len({e["group_id"] for e in eps})
    try:
        rows, n, k = pick_rows([int(e["group_id"]) for e in eps], n_prompts=args.n_prompts,
                               k_samples=args.k_samples, rng=np.random.default_rng(args.seed),
                               prompt_keys=[e["context"] for e in eps])
    except ValueError as err:
        raise MIError(f"step {step}: {err}") from None
    eps = [eps[r] for r in rows]
    model, tok = load_scorer(args.model)
    try:
        prompt_format = load_prompt_format(tok, args.chat_template)
    except (FileNotFoundError, TemplateError) as err:
        raise MIError(str(err).replace("policy.chat_template", "--chat-template")) from None
    contexts, reasonings = token_lists(eps, tok, trajectory=args.trajectory, ids=args.ids, prompt_format=prompt_format)
    contexts = contexts[::k]
    lengths = torch.tensor([len(z) for z in reasonings], dtype=torch.long).view(n, k)

    try:
        scores, full_s, full_tok = timed_score(model, contexts, reasonings, k, args.token_budget)
        # Each reasoning under its own prompt only: what an entropy-only diagnostic would pay.
        diag = [timed_score(model, [contexts[i]], reasonings[i * k:(i + 1) * k], k, args.token_budget)
                for i in range(n)]
    except ValueError as err:
        raise MIError(str(err)) from None
    t0 = time.perf_counter()
    # One measurement: the EMAs across training steps have nothing to average, so they are left out.
    metrics = {k: v for k, v in collapse_metrics(scores, lengths=lengths, n_perm=args.n_perm, seed=args.seed).items()
               if "_ema" not in k}
    metrics_s = time.perf_counter() - t0
    cost = {"full": {"seconds": round(full_s, 4), "scored_tokens": full_tok, "sequences": n * k * n},
            "matched": {"seconds": round(sum(d[1] for d in diag), 4),
                        "scored_tokens": sum(d[2] for d in diag), "sequences": n * k},
            "metrics_s": round(metrics_s, 4)}

    what = "every turn's reasoning" if args.trajectory else "first-turn reasoning"
    print(f"step {step}: {n} of {n_groups} groups x {k} reasonings ({what}, "
          f"{'stored ids' if args.ids else 're-tokenised'}) scored by {args.model}")
    print(f"{'metric':<28}{'value':>12}  {'needs':<14}{'seconds':>9}{'tokens':>10}")
    for name, value in metrics.items():
        need = "nothing" if name in FREE else "N*K matched" if name in MATCHED_ONLY else "N*K*N scores"
        c = {"seconds": 0.0, "scored_tokens": 0} if name in FREE else cost[
            "matched" if name in MATCHED_ONLY else "full"]
        print(f"{name:<28}{value:>12.4f}  {need:<14}{c['seconds']:>9.3f}{c['scored_tokens']:>10d}")
    print(f"(metrics from the scores, {args.n_perm} permutations included: {metrics_s:.3f} s)")
    print(json.dumps({"rollouts": str(args.rollouts), "model": args.model, "step": step, "n_prompts": n,
                      "k_samples": k, "trajectory": args.trajectory, "ids": args.ids, **metrics,
                      "cost": cost}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ragen2 mi", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except MIError as err:
        print(f"ragen2 mi: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
